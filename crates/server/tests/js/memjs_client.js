// memjs (binary protocol only) against `zipcache serve`: set/get/delete/incr/decr,
// add/replace/append/touch, a CAS round trip through memjs's own connection, and
// with USER and PASSWORD a SASL PLAIN login (a wrong password must fail).
// Usage: node memjs_client.js PORT [USER PASSWORD [WRONG_PASSWORD]]
'use strict';
const assert = require('assert');
const memjs = require('memjs');

const [port, user, password, wrong] = process.argv.slice(2);
const quiet = { log() {} };

function client(pass) {
  return memjs.Client.create(`127.0.0.1:${port}`, {
    username: user,
    password: pass,
    retries: 1,
    timeout: 5,
    logger: quiet,
  });
}

// One raw request through memjs's connection (and its SASL login): memjs has no CAS API.
function perform(mc, opcode, key, extras, value, cas) {
  mc.incrSeq();
  const request = memjs.Utils.makeRequestBuffer(opcode, key, extras, value, mc.seq);
  request.writeBigUInt64BE(cas, 16);
  return new Promise((resolve, reject) => {
    mc.perform(key, request, mc.seq, (err, response) => (err ? reject(err) : resolve(response)));
  });
}

async function main() {
  if (wrong !== undefined) {
    const refused = client(wrong);
    await assert.rejects(refused.set('k', 'v'), /authentication failed/);
    refused.close();
  }
  const mc = client(password);
  assert.strictEqual(await mc.set('greeting', 'hello', { expires: 0 }), true);
  assert.strictEqual((await mc.get('greeting')).value.toString(), 'hello');
  assert.strictEqual((await mc.get('missing')).value, null);
  const binary = Buffer.from([0, 1, 2, 0x80, 0xff, 13, 10]);
  await mc.set('binary', binary, {});
  assert.deepStrictEqual((await mc.get('binary')).value, binary);
  const big = Buffer.alloc(500000, 'x');
  await mc.set('big', big, {});
  assert.deepStrictEqual((await mc.get('big')).value, big);

  assert.strictEqual(await mc.add('greeting', 'again', {}), false);
  assert.strictEqual(await mc.add('fresh', 'new', {}), true);
  assert.strictEqual(await mc.replace('nope', 'x', {}), false);
  assert.strictEqual(await mc.replace('fresh', 'newer', {}), true);
  assert.strictEqual(await mc.append('fresh', '!'), true);
  // memjs 1.3.2's prepend sends the append opcode, so it is not tried here.
  assert.strictEqual((await mc.get('fresh')).value.toString(), 'newer!');
  assert.strictEqual(await mc.touch('fresh', 100), true);
  assert.strictEqual(await mc.touch('nope', 100), false);

  assert.deepStrictEqual(await mc.increment('counter', 5, { initial: 10 }), { success: true, value: 10 });
  assert.deepStrictEqual(await mc.increment('counter', 5, {}), { success: true, value: 15 });
  assert.deepStrictEqual(await mc.decrement('counter', 20, {}), { success: true, value: 0 });
  assert.strictEqual((await mc.get('counter')).value.toString().trim(), '0');

  assert.strictEqual(await mc.delete('greeting'), true);
  assert.strictEqual(await mc.delete('greeting'), false);
  assert.strictEqual((await mc.get('greeting')).value, null);

  // CAS: the CAS a get returns lets one write through; a stale one is refused.
  const SET = 0x01, GET = 0x00;
  const flagsAndExpiry = Buffer.alloc(8);
  const stored = await perform(mc, SET, 'cas', flagsAndExpiry, 'v1', 0n);
  assert.strictEqual(stored.header.status, 0);
  const got = await perform(mc, GET, 'cas', '', '', 0n);
  const cas = got.header.cas.readBigUInt64BE(0);
  assert.strictEqual(got.val.toString(), 'v1');
  const swapped = await perform(mc, SET, 'cas', flagsAndExpiry, 'v2', cas);
  assert.strictEqual(swapped.header.status, 0);
  const stale = await perform(mc, SET, 'cas', flagsAndExpiry, 'v3', cas);
  assert.strictEqual(stale.header.status, 2);
  assert.strictEqual((await mc.get('cas')).value.toString(), 'v2');

  await new Promise((resolve, reject) =>
    mc.stats((err, server, stats) => (err ? reject(err) : (assert.ok(Number(stats.cmd_get) > 0), resolve()))));
  mc.close();
  console.log('ok');
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});

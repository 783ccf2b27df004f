// ioredis's Cluster client against a fleet of `zipcache serve --cluster-mode on` nodes.
// Usage: node ioredis_cluster.js PORT... — reads the slot map from the fleet, sets 2,000
// keys (routed by slot; ioredis's auto-pipelining batches them per node) and reads every
// one back, runs a multi-key command within one hash tag, keeps 500 sessions as hashes
// (HSET, HGETALL, HINCRBY, HEXPIRE, TYPE), and prints "ok". Exits
// non-zero on the first failure.
const Redis = require("ioredis");

const ports = process.argv.slice(2).map(Number);
const cluster = new Redis.Cluster(
  ports.map((port) => ({ host: "127.0.0.1", port })),
  { enableAutoPipelining: true, redisOptions: { connectTimeout: 5000 } },
);

function fail(message) {
  console.error(message);
  process.exit(1);
}

(async () => {
  const key = (i) => `session:${(i * 2654435761) % 2 ** 32}:${i}`;
  const indexes = [...Array(2000).keys()];
  const set = await Promise.all(indexes.map((i) => cluster.set(key(i), `value:${i}`)));
  if (set.some((reply) => reply !== "OK")) fail(`set: ${set.find((r) => r !== "OK")}`);
  const got = await Promise.all(indexes.map((i) => cluster.get(key(i))));
  indexes.forEach((i) => {
    if (got[i] !== `value:${i}`) fail(`get ${key(i)}: ${got[i]}`);
  });
  if ((await cluster.mset("{cart:7}:a", "1", "{cart:7}:b", "2")) !== "OK") fail("mset");
  const both = await cluster.mget("{cart:7}:a", "{cart:7}:b");
  if (both.join(",") !== "1,2") fail(`mget: ${both}`);
  // Sessions as hashes, routed by slot like any key.
  const users = indexes.slice(0, 500);
  const session = (i) => ({ name: `n${i}`, visits: String(i), cart: `{"items":${i % 7}}` });
  const added = await Promise.all(users.map((i) => cluster.hset(`user:${i}`, session(i))));
  if (added.some((n) => n !== 3)) fail(`hset: ${added.find((n) => n !== 3)}`);
  const sessions = await Promise.all(users.map((i) => cluster.hgetall(`user:${i}`)));
  // Fields come in field order (a small Redis hash gives insertion order).
  const sorted = (o) => JSON.stringify(Object.keys(o).sort().map((k) => [k, o[k]]));
  users.forEach((i) => {
    if (sorted(sessions[i]) !== sorted(session(i))) {
      fail(`hgetall user:${i}: ${JSON.stringify(sessions[i])}`);
    }
  });
  if ((await cluster.hincrby("user:1", "visits", 10)) !== 11) fail("hincrby");
  const expired = await cluster.call("HEXPIRE", "user:1", "100", "FIELDS", "1", "cart");
  if (String(expired) !== "1") fail(`hexpire: ${expired}`);
  const kind = await cluster.type("user:1");
  if (kind !== "hash") fail(`type: ${kind}`);
  const masters = cluster.nodes("master").length;
  if (masters !== ports.length) fail(`${masters} masters, not ${ports.length}`);
  cluster.disconnect();
  console.log("ok");
})().catch((error) => fail(error.stack || String(error)));

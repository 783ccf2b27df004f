"""Real client libraries against `zipcache serve`: pymemcache and redis-py.

Usage: clients.py MEMCACHED_PORT RESP_PORT. Exits non-zero on the first failure.
"""
import sys
import time

from pymemcache.client.base import Client as Memcache
import redis

MC_PORT, RESP_PORT = int(sys.argv[1]), int(sys.argv[2])


def memcached():
    mc = Memcache(("127.0.0.1", MC_PORT), connect_timeout=5, timeout=10)
    assert mc.set("k", b"v") is True
    assert mc.get("k") == b"v"
    value, cas = mc.gets("k")
    assert value == b"v" and cas
    assert mc.cas("k", b"v2", cas) is True
    assert mc.cas("k", b"v3", cas) is False, "stale cas must fail"
    assert mc.get("k") == b"v2"
    assert mc.add("k", b"x", noreply=False) is False
    assert mc.replace("missing", b"x", noreply=False) is False
    mc.set("n", b"41")
    assert mc.incr("n", 1) == 42
    assert mc.decr("n", 50) == 0
    assert mc.incr("missing", 1) is None
    mc.set("s", b"mid")
    assert mc.append("s", b"-end")
    assert mc.prepend("s", b"start-")
    assert mc.get("s") == b"start-mid-end"
    mc.set("ttl", b"x", expire=1)
    assert mc.get("ttl") == b"x"
    assert mc.touch("ttl", 1, noreply=False)
    time.sleep(2.1)
    assert mc.get("ttl") is None, "expired after its TTL"
    assert mc.delete("s", noreply=False) is True
    assert mc.delete("s", noreply=False) is False
    # Sizes 0 B .. 1 MiB, binary-safe.
    for size in [0, 1, 100, 4096, 100_000, 1 << 20]:
        blob = bytes((i * 7 + size) % 256 for i in range(size))
        assert mc.set("blob%d" % size, blob, noreply=False), size
        assert mc.get("blob%d" % size) == blob, size
    assert mc.set_many({"m%d" % i: b"%d" % i for i in range(200)}) == []
    got = mc.get_many(["m%d" % i for i in range(200)])
    assert got == {"m%d" % i: b"%d" % i for i in range(200)}
    stats = mc.stats()
    assert b"hit_ratio" in stats and b"curr_connections" in stats, stats
    assert mc.version()
    mc.close()


def resp():
    r = redis.Redis(host="127.0.0.1", port=RESP_PORT, socket_timeout=10)
    assert r.ping()
    r.flushall()
    assert r.set("k", "v")
    assert r.get("k") == b"v"
    assert r.set("k", "w", nx=True) is None
    assert r.set("k", "w", xx=True)
    assert r.getset("k", "z") == b"w"
    assert r.incr("n") == 1 and r.incrby("n", 10) == 11 and r.decr("n") == 10
    try:
        r.incr("k")
        raise AssertionError("INCR on a non-integer must fail")
    except redis.ResponseError as e:
        assert "not an integer" in str(e)
    r.set("t", "x", px=1500)
    assert 0 < r.pttl("t") <= 1500
    assert r.ttl("k") == -1 and r.ttl("missing") == -2
    assert r.expire("k", 100) and 99 <= r.ttl("k") <= 100
    assert r.persist("k") and r.ttl("k") == -1
    time.sleep(1.6)
    assert r.get("t") is None, "expired after PX"
    assert r.exists("k", "n", "missing") == 2
    assert r.delete("k", "missing") == 1
    r.mset({"a%03d" % i: str(i) for i in range(300)})
    assert r.mget("a000", "a299", "zzz") == [b"0", b"299", None]
    # SCAN in key order, cursor resumes after the last key.
    keys = list(r.scan_iter(match="a*", count=37))
    assert keys == sorted(keys) and len(keys) == 300, len(keys)
    assert sorted(r.scan_iter(match="a29?")) == [b"a29%d" % i for i in range(10)]
    # Cursors are numbers to redis-py (`int()`), whatever the keys they stand for.
    r.mset({"user:zz-%03d" % i: str(i) for i in range(300)})
    keys = list(r.scan_iter(match="user:*", count=37))
    assert len(keys) == 300 and len(set(keys)) == 300, len(keys)
    r.hset("big-hash", mapping={"field:xy-%03d" % i: str(i) for i in range(300)})
    fields = dict(r.hscan_iter("big-hash", count=29))
    assert fields == {b"field:xy-%03d" % i: b"%d" % i for i in range(300)}, len(fields)
    assert r.hscan("big-hash", 0, count=5)[0] != 0
    # Key-range command.
    flat = r.execute_command("ZCRANGE", "a010", "a013")
    assert flat == [b"a010", b"10", b"a011", b"11", b"a012", b"12"], flat
    assert r.execute_command("ZCRANGE", "a000", "+", "LIMIT", "2") == [b"a000", b"0", b"a001", b"1"]
    # Pipelines.
    pipe = r.pipeline(transaction=False)
    for i in range(500):
        pipe.set("p%d" % i, i)
    for i in range(500):
        pipe.get("p%d" % i)
    results = pipe.execute()
    assert results[:500] == [True] * 500
    assert results[500:] == [b"%d" % i for i in range(500)]
    for size in [0, 1, 65536, 1 << 20]:
        blob = bytes((i * 13 + size) % 256 for i in range(size))
        assert r.set("bin", blob)
        assert r.get("bin") == blob
    info = r.info()
    assert "compression_ratio_dram" in info and "connected_clients" in info
    assert r.dbsize() > 0
    r.client_setname("tester")
    assert r.client_getname() == "tester"
    assert r.client_id() > 0
    assert r.config_get("maxmemory")
    # Commands beyond the first set: what cache users of Redis reach for.
    r.set("ex", "v")
    assert r.getex("ex", ex=100) == b"v" and 99 <= r.ttl("ex") <= 100
    assert r.getex("ex", persist=True) == b"v" and r.ttl("ex") == -1
    assert r.getex("missing", px=10) is None
    assert r.incrbyfloat("fl", 10.5) == 10.5 and r.incrbyfloat("fl", 0.1) == 10.6
    assert r.msetnx({"nx1": 1, "nx2": 2}) is True
    assert r.msetnx({"nx2": 3, "nx3": 3}) is False and r.get("nx3") is None
    at = int(time.time()) + 1000
    assert r.expireat("nx1", at) and r.expiretime("nx1") == at
    assert r.pexpireat("nx1", at * 1000) and r.pexpiretime("nx1") == at * 1000
    assert r.expireat("nx1", at + 10, gt=True) and not r.expireat("nx1", at, gt=True)
    assert r.expiretime("missing") == -2 and r.expiretime("nx2") == -1
    r.set("range", "Hello World")
    assert r.getrange("range", 0, 4) == b"Hello" and r.getrange("range", -5, -1) == b"World"
    assert r.setrange("range", 6, "Redis") == 11 and r.get("range") == b"Hello Redis"
    assert r.setrange("padded", 3, "x") == 4 and r.get("padded") == b"\0\0\0x"
    assert r.keys("a00*") == [b"a00%d" % i for i in range(10)]
    assert r.keys("nx*") == [b"nx1", b"nx2"]
    r.close()


memcached()
resp()
print("ok")

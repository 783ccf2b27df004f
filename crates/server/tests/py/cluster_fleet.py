"""redis-py's cluster client against a fleet of `zipcache serve --cluster-mode on` nodes.

Usage: cluster_fleet.py PORT... KEYS. Reads the slot map from the fleet, checks it
against the nodes, writes KEYS random-looking keys (pipelined, routed by slot) and reads
every one back, then prints "dbsize N N N" (each node's keys, in the order of the ports
given) and "ok". Exits non-zero on the first failure.
"""
import sys

import redis
from redis.cluster import ClusterNode, RedisCluster

*PORTS, KEYS = [int(a) for a in sys.argv[1:]]

rc = RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", p) for p in PORTS])

# The slot map names every node, and every slot has one.
slots = rc.cluster_slots()
covered = sum(last - first + 1 for (first, last) in slots)
assert covered == 16384, slots
assert sorted(n.port for n in rc.get_primaries()) == sorted(PORTS), rc.get_primaries()

key = lambda i: f"user:{(i * 2654435761) % 2**32:08x}:{i}"
for start in range(0, KEYS, 1000):
    pipe = rc.pipeline()
    for i in range(start, min(start + 1000, KEYS)):
        pipe.set(key(i), f"value:{i}")
    assert all(r is True for r in pipe.execute())
for start in range(0, KEYS, 1000):
    pipe = rc.pipeline()
    for i in range(start, min(start + 1000, KEYS)):
        pipe.get(key(i))
    got = pipe.execute()
    for i, value in zip(range(start, min(start + 1000, KEYS)), got):
        assert value == f"value:{i}".encode(), (i, value)

# Multi-key commands within one slot run; across slots the server refuses them.
assert rc.mset({"{s:1}:a": "1", "{s:1}:b": "2"}) is True
assert rc.mget("{s:1}:a", "{s:1}:b") == [b"1", b"2"]
assert rc.delete("{s:1}:a", "{s:1}:b") == 2

sizes = [redis.Redis(host="127.0.0.1", port=p).dbsize() for p in PORTS]
print("dbsize " + " ".join(str(s) for s in sizes))
print("ok")

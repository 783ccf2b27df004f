"""redis-py's cluster client against `zipcache serve --cluster-mode emulated`.

Usage: cluster_clients.py RESP_PORT. Reads the slot map, writes and reads back every
key, multi-key commands within a hash tag and across slots. Prints "ok"; exits
non-zero on the first failure.
"""
import sys

from redis.cluster import RedisCluster
from redis.exceptions import ClusterCrossSlotError, RedisClusterException

PORT = int(sys.argv[1])

rc = RedisCluster(host="127.0.0.1", port=PORT)

# The slot map: one node owns every slot, at the address the client reached.
slots = rc.cluster_slots()
assert slots == {(0, 16383): {"primary": ("127.0.0.1", PORT), "replicas": []}}, slots
nodes = rc.get_nodes()
assert [(n.host, n.port) for n in nodes] == [("127.0.0.1", PORT)], nodes

# Every key, routed by its slot.
for i in range(3000):
    assert rc.set(f"key:{i}", f"value:{i}") is True
for i in range(3000):
    assert rc.get(f"key:{i}") == f"value:{i}".encode(), i
assert rc.keyslot("key:7") == rc.cluster_keyslot("key:7")

# Multi-key commands: within one hash tag they run; across slots the client splits
# them (the *_nonatomic forms) or refuses them, and the server refuses them too.
assert rc.mset({"{user:1}:name": "ada", "{user:1}:mail": "a@x"}) is True
assert rc.mget("{user:1}:name", "{user:1}:mail") == [b"ada", b"a@x"]
assert rc.mget_nonatomic([f"key:{i}" for i in range(10)]) == [
    f"value:{i}".encode() for i in range(10)
]
try:
    rc.mget("key:1", "key:2")
    raise AssertionError("a cross-slot MGET must be refused")
except RedisClusterException:
    pass
node = rc.get_node("127.0.0.1", PORT)
try:
    rc.execute_command("MGET", "key:1", "key:2", target_nodes=node)
    raise AssertionError("the server must refuse a cross-slot MGET")
except ClusterCrossSlotError:
    pass
assert rc.delete("key:1", "key:2", "key:3") == 3
assert rc.exists("key:1", "key:4") == 1
assert rc.cluster_countkeysinslot(rc.keyslot("key:4")) >= 1
in_slot = rc.cluster_get_keys_in_slot(rc.keyslot("key:4"), 100)
assert "key:4" in [k.decode() if isinstance(k, bytes) else k for k in in_slot], in_slot
assert rc.dbsize() == 2999
print("ok")

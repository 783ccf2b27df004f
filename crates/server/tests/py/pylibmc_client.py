"""pylibmc (libmemcached) over memcached's binary protocol against `zipcache serve`.

Usage: pylibmc_client.py PORT [USER PASSWORD WRONG_PASSWORD]
Without a user: the commands on an open server. With one: a SASL login (libmemcached
asks for the mechanisms and lets Cyrus SASL pick: CRAM-MD5 when listed), the same
commands, and a wrong password refused. Exits non-zero on the first failure.
"""
import sys
import time

import pylibmc

PORT = int(sys.argv[1])
USER, PASSWORD, WRONG = (sys.argv[2:5] + [None, None, None])[:3]


def client(password=PASSWORD):
    credentials = dict(username=USER, password=password) if USER else {}
    return pylibmc.Client(["127.0.0.1:%d" % PORT], binary=True,
                          behaviors={"cas": True, "connect_timeout": 5000,
                                     "receive_timeout": 10000000},
                          **credentials)


def commands(mc):
    assert mc.set("k", b"v") is True
    assert mc.get("k") == b"v"
    assert mc.get("missing") is None
    value, cas = mc.gets("k")
    assert value == b"v" and cas
    assert mc.cas("k", b"v2", cas) is True
    assert mc.cas("k", b"v3", cas) is False, "a stale cas must fail"
    assert mc.get("k") == b"v2"
    assert mc.add("k", b"x") is False
    assert mc.add("fresh", b"x") is True
    try:
        mc.replace("missing", b"x")
        raise AssertionError("replace of a missing key must fail")
    except pylibmc.NotFound:  # the binary protocol's KEY_ENOENT, as memcached's
        pass
    assert mc.replace("fresh", b"y") is True
    mc.set("n", b"41")
    assert mc.incr("n", 1) == 42
    assert mc.decr("n", 50) == 0
    try:
        mc.incr("no-counter", 1)
        raise AssertionError("incr of a missing key must fail")
    except pylibmc.NotFound:
        pass
    mc.set("s", b"mid")
    assert mc.append("s", b"-end")
    assert mc.prepend("s", b"start-")
    assert mc.get("s") == b"start-mid-end"
    # Flags carry the Python type: an int and a pickled object come back as such.
    mc.set("int", 7)
    mc.set("obj", {"a": [1, 2]})
    assert mc.get("int") == 7 and mc.get("obj") == {"a": [1, 2]}
    # Quiet gets behind a NOOP (GETKQ), hits and misses mixed.
    assert mc.set_multi({"m1": b"1", "m2": b"2", "m3": b"3"}) == []
    assert mc.get_multi(["m1", "nope", "m3"]) == {"m1": b"1", "m3": b"3"}
    assert mc.delete_multi(["m1", "m2"]) is True
    assert mc.get_multi(["m1", "m2", "m3"]) == {"m3": b"3"}
    for size in (0, 1, 1000, 100_000, 500_000):
        value = bytes(range(256)) * (size // 256) + b"\r\n\0"[: size % 256]
        assert mc.set("bin%d" % size, value)
        assert mc.get("bin%d" % size) == value, size
    mc.set("ttl", b"x", time=1)
    assert mc.get("ttl") == b"x"
    assert mc.touch("ttl", 1)
    time.sleep(2.1)
    assert mc.get("ttl") is None, "expired after its TTL"
    assert mc.delete("s") is True
    assert mc.delete("s") is False
    stats = dict(mc.get_stats()[0][1])
    assert int(stats["cmd_get"]) > 0, stats
    assert mc.flush_all()
    assert mc.get("k") is None


def main():
    commands(client())
    if USER:
        refused = client(WRONG)
        try:
            refused.set("k", b"v")
            raise AssertionError("a wrong password must be refused")
        except pylibmc.Error as e:
            assert "AUTHENTICATION FAILURE" in str(e), e
    print("ok")


main()

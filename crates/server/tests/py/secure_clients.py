"""redis-py and pymemcache against a server with a password and/or TLS.

Usage: secure_clients.py [--resp PORT] [--memcached PORT] [--password PW] [--ca CA.pem]
       [--client-cert CERT.pem --client-key KEY.pem]
With --ca both ports speak TLS; with a client certificate, a client without one must be
refused. Exits non-zero on the first failure.
"""
import argparse
import ssl

from pymemcache.client.base import Client as Memcache
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

parser = argparse.ArgumentParser()
parser.add_argument("--resp", type=int)
parser.add_argument("--memcached", type=int)
parser.add_argument("--password")
parser.add_argument("--ca")
parser.add_argument("--client-cert")
parser.add_argument("--client-key")
args = parser.parse_args()


def resp_client(protocol, password=args.password, certificate=True):
    tls = {}
    if args.ca:
        tls = dict(ssl=True, ssl_ca_certs=args.ca)
        if args.client_cert and certificate:
            tls.update(ssl_certfile=args.client_cert, ssl_keyfile=args.client_key)
    # No retries: refusals are expected here, and redis-py 8 retries them with backoff.
    return redis.Redis(host="127.0.0.1", port=args.resp, password=password,
                       protocol=protocol, socket_timeout=10,
                       retry=Retry(NoBackoff(), 0), **tls)


def resp():
    # protocol 3 logs in with HELLO 3 AUTH default PW, protocol 2 with AUTH PW.
    for protocol in (2, 3):
        r = resp_client(protocol)
        assert r.ping()
        assert r.set("k%d" % protocol, "v")
        assert r.get("k%d" % protocol) == b"v"
        r.delete("f%d" % protocol)
        assert r.incrbyfloat("f%d" % protocol, 0.5) == 0.5
        r.close()
    if args.password:
        try:
            resp_client(3, password="wrong").ping()
            raise AssertionError("a wrong password must be refused")
        except redis.AuthenticationError:
            pass
        try:
            resp_client(2, password=None).get("k2")
            raise AssertionError("no password must be refused")
        except redis.AuthenticationError as e:
            assert "NOAUTH" in str(e) or "Authentication required" in str(e), e
    if args.client_cert:
        try:
            resp_client(2, certificate=False).ping()
            raise AssertionError("a client without a certificate must be refused")
        except (redis.ConnectionError, ssl.SSLError, OSError):
            pass


def memcached():
    context = ssl.create_default_context(cafile=args.ca)
    if args.client_cert:
        context.load_cert_chain(args.client_cert, args.client_key)
    mc = Memcache(("127.0.0.1", args.memcached), tls_context=context,
                  connect_timeout=5, timeout=10)
    if args.password:
        # memcached's ascii auth; the password is the default user's, as on RESP.
        try:
            mc.get("tls")
            raise AssertionError("memcached must refuse a client that has not logged in")
        except Exception as e:
            assert "unauthenticated" in str(e), e
        assert mc.set("auth", "default " + args.password, noreply=False)
    assert mc.set("tls", b"over tls", noreply=False)
    assert mc.get("tls") == b"over tls"
    big = bytes(range(256)) * 4096
    assert mc.set("big", big, noreply=False)
    assert mc.get("big") == big
    mc.close()


if args.resp:
    resp()
if args.memcached:
    memcached()
print("ok")

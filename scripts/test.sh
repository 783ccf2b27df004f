#!/usr/bin/env bash
# Installs what the tests need on a fresh Debian machine, then runs every check and test.
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
[ "$(id -u)" = 0 ] || SUDO=sudo
# Peers and tools the integration tests start themselves (on 127.0.0.1, stopped by PID).
$SUDO apt-get update -qq
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
    memcached libmemcached-tools redis-server redis-tools nutcracker openssl \
    libmemcached-dev libsasl2-modules >/dev/null
# Node with npm: the machine image ships NodeSource's nodejs, which bundles npm and
# conflicts with Debian's npm package; install Debian's pair only where there is none.
if ! command -v npm >/dev/null; then
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null
fi
# memjs, the binary-protocol client of tests/binary_clients.rs, and ioredis, the cluster
# client of tests/cluster_fleet.rs (found through `npm root -g`).
$SUDO npm install --global --silent memjs ioredis
# Python clients for the client tests; vega_datasets is the real-data value source,
# botocore's JSON files the mixed-schema documents' (`--values json-mixed`).
# pylibmc is built against libmemcached-dev: its wheel bundles a Cyrus SASL that finds
# none of the system's mechanisms, so its SASL logins fail.
python3 -m pip install --quiet --disable-pip-version-check --no-binary pylibmc \
    pymemcache redis==8.1.0 vega_datasets botocore pylibmc pytest packaging
# redis-py's own test suite (its source release, of the version installed): its hash
# tests run against our server (tests/hashes.rs).
REDIS_PY=$(python3 -c 'import redis; print(redis.__version__)')
if [ ! -d "target/test-deps/redis-$REDIS_PY/tests" ]; then
    mkdir -p target/test-deps
    python3 -m pip download --quiet --disable-pip-version-check --no-deps \
        --no-binary :all: "redis==$REDIS_PY" -d target/test-deps
    tar xzf "target/test-deps/redis-$REDIS_PY.tar.gz" -C target/test-deps
fi

cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
cargo test --workspace --release

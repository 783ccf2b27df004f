#!/usr/bin/env bash
# One redis-benchmark test against a server started here, and the server's CPU per request:
# requests/s, and utime + stime of the server from /proc/PID/stat over the measured test
# divided by its requests (docs/RESULTS.md, "CPU per SET of tiny values", "A round's
# replies together"). Before the measured test, 400,000 SETs (-P 16) fill the keys.
# A bench, not a test: CI does not run it.
#
#   scripts/redis-cpu.sh zipcache 16 --threads 1     # zipcache serve, GET -P 16, one thread
#   TEST=set N=400000 scripts/redis-cpu.sh redis 1   # redis-server, SET -P 1
#   TEST=hget scripts/redis-cpu.sh zipcache 16       # HGET of one field of a large hash
#
# Arguments: SERVER (zipcache | redis), PIPELINE, then flags for `zipcache serve`.
# Environment: TEST (get; or any redis-benchmark -t test, such as set or hset; or hget:
# `HGET myhash element:__rand_int__`, one field of the hash that 400,000 HSETs of
# `-t hset` made first), N (1000000 requests), C (50 clients), BIN
# (target/release/zipcache).
set -euo pipefail
cd "$(dirname "$0")/.."
server=$1
pipeline=$2
shift 2
BIN=${BIN:-target/release/zipcache}
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
data=$(mktemp -d /tmp/zipcache-redis-cpu.XXXXXX)
if [ "$server" = redis ]; then
    redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$data" \
        >/dev/null 2>&1 &
else
    "$BIN" serve --listen 127.0.0.1 --memcached-port off --resp-port "$port" --dram 64MiB \
        --ssd none --data-dir "$data/zipcache" "$@" >/dev/null 2>&1 &
fi
pid=$!
trap 'kill $pid 2>/dev/null || true; wait $pid 2>/dev/null || true; rm -rf "$data"' EXIT
for _ in $(seq 200); do
    redis-cli -p "$port" ping >/dev/null 2>&1 && break
    sleep 0.05
done
test=${TEST:-get}
if [ "$test" = hget ]; then
    redis-benchmark -p "$port" -t hset -n 400000 -r 200000 -d 64 -c 50 -P 16 -q >/dev/null
    measured=(HGET myhash 'element:__rand_int__')
else
    redis-benchmark -p "$port" -t set -n 400000 -r 200000 -d 64 -c 50 -P 16 -q >/dev/null
    measured=(-t "$test")
fi
cpu() { awk '{ print $14 + $15 }' "/proc/$pid/stat"; }
ticks=$(getconf CLK_TCK)
before=$(cpu)
n=${N:-1000000}
rps=$(redis-benchmark -p "$port" -n "$n" -r 200000 -d 64 -c "${C:-50}" -P "$pipeline" -q \
    "${measured[@]}" | tr '\r' '\n' | awk '/requests per second/ { for (i = 1; i < NF; i++) if ($(i + 1) == "requests") print $i }')
after=$(cpu)
python3 -c "print(f'$server $* -P $pipeline $test: {float($rps):,.0f} requests/s, ' \
    f'{($after - $before) / $ticks * 1e6 / $n:.2f} µs of server CPU per request')"

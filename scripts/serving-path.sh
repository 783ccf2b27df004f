#!/usr/bin/env bash
# The serving-path figures, DRAM only, peers in the same run (docs/RESULTS.md,
# "The serving path measured honestly"). Every figure is the median of RUNS runs, the
# servers taking turns within each run so they share the machine's noise:
#
#  1. redis-benchmark `-t set,get -n 400000 -r 200000 -d 64 -c 50 -P 16` and `-P 1` against
#     `zipcache serve` (RESP), `zipcache serve --threads 1` and
#     `redis-server --save "" --appendonly no`: requests per second;
#  2. server CPU µs per GET (utime + stime of the server from /proc/PID/stat over the
#     measured phase, per measured request): `zipcache bench --target
#     zipcache-serve,redis,memcached`, GET only, every key resident, uniform keys and
#     `--locality moderate`, closed loop at the bench's default concurrency (2 threads ×
#     4 connections × 16 pipelined);
#  3. GET p50/p99/p999 open loop (`--rate`) at 50 % of each server's own peak, the peak
#     being the closed-loop uniform throughput of the same run.
#
# A bench, not a test: CI does not run it.
#
#   scripts/serving-path.sh                 # RUNS=3, writes $OUT/serving-path.md
#
# Environment: RUNS (3), OUT (a fresh temp dir), NO_BUILD (0), BIN (target/release/zipcache).
set -euo pipefail
cd "$(dirname "$0")/.."

RUNS=${RUNS:-3}
BIN=${BIN:-target/release/zipcache}
OUT=${OUT:-$(mktemp -d /tmp/zipcache-serving-path.XXXXXX)}
mkdir -p "$OUT"
[ "${NO_BUILD:-0}" = 1 ] || cargo build --release -p zipcache-cli >&2

PIDS=()
cleanup() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
}
trap cleanup EXIT

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

wait_port() {
    for _ in $(seq 200); do
        redis-cli -p "$1" ping >/dev/null 2>&1 && return 0
        sleep 0.05
    done
    echo "nothing answers on port $1" >&2
    return 1
}

# --- 1. redis-benchmark -------------------------------------------------------------------
declare -A PORT
start_zipcache() { # NAME [serve flags...]
    local name=$1
    shift
    PORT[$name]=$(free_port)
    "$BIN" serve --listen 127.0.0.1 --memcached-port off --resp-port "${PORT[$name]}" \
        --dram 64MiB --ssd none --data-dir "$OUT/$name-data" "$@" >"$OUT/$name.log" 2>&1 &
    PIDS+=($!)
    wait_port "${PORT[$name]}"
}
start_redis() {
    PORT[redis]=$(free_port)
    redis-server --port "${PORT[redis]}" --bind 127.0.0.1 --save "" --appendonly no \
        --dir "$OUT" >"$OUT/redis.log" 2>&1 &
    PIDS+=($!)
    wait_port "${PORT[redis]}"
}

start_zipcache zipcache
start_zipcache zipcache-t1 --threads 1
start_redis

RB=$OUT/redis-benchmark.csv
echo "run,server,pipeline,test,rps" >"$RB"
for run in $(seq "$RUNS"); do
    for pipeline in 16 1; do
        for server in zipcache zipcache-t1 redis; do
            echo "redis-benchmark run $run -P $pipeline $server" >&2
            redis-benchmark -h 127.0.0.1 -p "${PORT[$server]}" -t set,get -n 400000 \
                -r 200000 -d 64 -c 50 -P "$pipeline" --csv |
                awk -F'"' -v r="$run" -v s="$server" -v p="$pipeline" \
                    'NR > 1 { print r "," s "," p "," $2 "," $4 }' >>"$RB"
        done
    done
done
cleanup
PIDS=()

# --- 2. and 3. the bench: CPU per GET, open-loop p99 at half of each server's peak ---------
KEYS=200000
COMMON=(--dram 64MiB --ssd none --keys "$KEYS" --value-size 64 --warmup-ops 2000000)
TARGETS=zipcache-serve,redis,memcached
for run in $(seq "$RUNS"); do
    for locality in zero moderate; do
        echo "bench run $run closed loop --locality $locality" >&2
        "$BIN" bench --target "$TARGETS" "${COMMON[@]}" --locality "$locality" \
            --ops 1000000 --json "$OUT/closed-$locality-$run.json" >&2
    done
    for target in ${TARGETS//,/ }; do
        peak=$(jq -r --arg t "$target" '.[] | select(.target == $t) | .throughput_ops' \
            "$OUT/closed-zero-$run.json")
        rate=$(python3 -c "print(round($peak / 2))")
        echo "bench run $run open loop $target --rate $rate" >&2
        "$BIN" bench --target "$target" "${COMMON[@]}" --locality zero --rate "$rate" \
            --duration 10 --json "$OUT/open-$target-$run.json" >&2
    done
done

python3 - "$OUT" "$RUNS" >"$OUT/serving-path.md" <<'EOF'
import csv, json, statistics, sys
out, runs = sys.argv[1], int(sys.argv[2])
med = statistics.median
rows = list(csv.DictReader(open(f"{out}/redis-benchmark.csv")))
def rb(server, pipeline, test):
    v = [float(r["rps"]) for r in rows
         if r["server"] == server and r["pipeline"] == str(pipeline) and r["test"] == test]
    return med(v), min(v), max(v)
print(f"redis-benchmark, requests/s, median of {runs} (min–max):\n")
print("| | zipcache serve | zipcache serve --threads 1 | redis-server | ratio | ratio, --threads 1 |")
print("|---|---:|---:|---:|---:|---:|")
for p in (16, 1):
    for test in ("SET", "GET"):
        z, z1, r = rb("zipcache", p, test), rb("zipcache-t1", p, test), rb("redis", p, test)
        cell = lambda m: f"{m[0]:,.0f} ({m[1]:,.0f}–{m[2]:,.0f})"
        print(f"| `-P {p}` {test} | {cell(z)} | {cell(z1)} | {cell(r)} | "
              f"{z[0] / r[0]:.2f}× | {z1[0] / r[0]:.2f}× |")
def results(name):
    return [json.load(open(f"{out}/{name}-{run}.json")) for run in range(1, runs + 1)]
print(f"\nBench, DRAM only, GET only, every key resident, closed loop; median of {runs} "
      "(per run in brackets):\n")
print("| server | uniform: ops/s | uniform: server CPU µs/GET | moderate: ops/s | "
      "moderate: server CPU µs/GET | hit ratio (lowest) |")
print("|---|---:|---:|---:|---:|---:|")
targets = ("zipcache-serve", "redis", "memcached")
def row(name, target):
    return [next(x for x in res if x["target"] == target) for res in results(name)]
def figure(rs, field, fmt):
    vals = [r[field] for r in rs]
    return f"{med(vals):{fmt}} ({', '.join(format(v, fmt) for v in vals)})"
for target in targets:
    zero, moderate = row("closed-zero", target), row("closed-moderate", target)
    hit = min(r["hit_ratio"] for r in zero + moderate)
    print(f"| {target} | {figure(zero, 'throughput_ops', ',.0f')} | "
          f"{figure(zero, 'server_cpu_s_per_mop', '.2f')} | "
          f"{figure(moderate, 'throughput_ops', ',.0f')} | "
          f"{figure(moderate, 'server_cpu_s_per_mop', '.2f')} | {hit:.4f} |")
print("\nOpen loop, uniform keys, offered = half of the same run's closed-loop uniform "
      "throughput; per run (a median would mix runs that kept up with runs that did not):\n")
print("| server | run | offered/s | achieved/s | GET p50 µs | p99 µs | p999 µs | server CPU µs/GET | bench CPU s |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
for target in targets:
    for run, r in enumerate(row(f"open-{target}", target), 1):
        lat = r["get_latency_us"]
        print(f"| {target} | {run} | {r['workload']['rate']:,.0f} | {r['throughput_ops']:,.0f} | "
              f"{lat['p50']:,.0f} | {lat['p99']:,.0f} | {lat['p999']:,.0f} | "
              f"{r['server_cpu_s_per_mop']:.2f} | {r['bench_cpu_seconds']:.2f} |")
EOF
cat "$OUT/serving-path.md"
echo "wrote $OUT/serving-path.md" >&2

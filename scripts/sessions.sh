#!/usr/bin/env bash
# Web sessions as Redis hashes (issue 34; docs/SERVER.md "Hashes"): the figures of
# RESULTS.md's sessions rows, written to OUTDIR/summary.md. A bench, not a test: CI does
# not run it (tests/hashes.rs and tests/differential.rs are the tests).
#
#   a. sessions held: `zipcache bench sessions` — each server started with the same DRAM
#      budget (redis-server `--maxmemory`, ZipCache `--dram`), SESSIONS sessions of 12
#      fields written by pipelined HSET + EXPIRE, every one read back by HGETALL and
#      compared with what was written (whole, gone or wrong) — RUNS runs;
#   b. redis-benchmark -t hset -P 16 (one hash of up to 100,000 fields: a large hash), HGET
#      of one of its fields, and HGETALL of one 12-field session, -P 16, against ZipCache
#      and redis-server;
#   c. ZipCache with an SSD tier of SSD behind the same DRAM, SSD_SESSIONS sessions
#      (sessions per MiB of flash);
#   d. real records as hashes (`--values records`: vega_datasets' rows, a field per
#      column), RECORDS written into each server, as part a;
#   e. rates and server CPU with every session held by both servers (HELD_SESSIONS, fewer
#      than Redis holds in DRAM_MIB): part a's reads are mostly misses for Redis, whose
#      64 MiB holds a sixth of what ZipCache's does — here both answer every HGETALL with a
#      whole session — RUNS runs.
#
#   scripts/sessions.sh OUTDIR
#
# The SSD run sets `flush_wait_ms=60000`: a session store would rather its writers wait
# for the flusher than have it drop sessions unwritten when a fill outruns the disk.
#
# Environment: RUNS (3), DRAM_MIB (64), SESSIONS (700000), SSD (1GiB), SSD_SESSIONS
# (3000000), RECORDS (2500000), HELD_SESSIONS (40000), BENCH_N (400000), SKIP (letters of
# parts not to run), NO_BUILD (0), BIN (target/release/zipcache). About 16 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib/memcached-port.sh
source scripts/lib/memcached-port.sh

OUT=${1:?usage: scripts/sessions.sh OUTDIR}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
RUNS=${RUNS:-3}
DRAM_MIB=${DRAM_MIB:-64}
DRAM=${DRAM_MIB}MiB
SESSIONS=${SESSIONS:-700000}
SSD=${SSD:-1GiB}
SSD_SESSIONS=${SSD_SESSIONS:-3000000}
RECORDS=${RECORDS:-2500000}
HELD_SESSIONS=${HELD_SESSIONS:-40000}
BENCH_N=${BENCH_N:-400000}
BIN=${BIN:-target/release/zipcache}
[ "${NO_BUILD:-0}" = 1 ] || cargo build --release -q -p zipcache-cli
BIN=$(realpath "$BIN")
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done' EXIT

summary="$OUT/summary.md"
{
    echo "# Sessions as hashes ($(date -u '+%F %H:%M'), $(nproc) cores, $(git rev-parse --short HEAD), load $(cut -d' ' -f1-3 /proc/loadavg))"
    echo
} >"$summary"

skip() { [[ "${SKIP:-}" == *"$1"* ]]; }

# RUNS runs of `zipcache bench sessions` of $2 sessions (into OUT/$1-RUN) and a table of
# the fields named after $2 and the server CPU, each run's figure and the medians' ratio.
runs_table() {
    local name=$1 sessions=$2
    shift 2
    for run in $(seq "$RUNS"); do
        "$BIN" bench sessions --sessions "$sessions" --dram "$DRAM" --out "$OUT/$name-$run" \
            >"$OUT/$name-$run.txt"
    done
    python3 - "$OUT/$name" "$RUNS" "$@" >>"$summary" <<'PY'
import json, statistics, sys
prefix, runs, fields = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
rows = [{t["target"]: t for t in json.load(open(f"{prefix}-{r}/sessions.json"))}
        for r in range(1, runs + 1)]
names = {"whole": "sessions held whole", "hset_per_second": "HSET + EXPIRE per s",
         "hgetall_per_second": "HGETALL per s"}
def med(target, field):
    return statistics.median(run[target][field] for run in rows)
print("| | ZipCache | redis-server | ratio (medians) |")
print("|---|---|---|---|")
for field in fields:
    each = lambda t: " · ".join(f"{run[t][field]:,.0f}" for run in rows)
    z, r = med("zipcache", field), med("redis", field)
    print(f"| {names[field]} | {each('zipcache')} | {each('redis')} | {z / r:.2f}x |")
for field, name in [("server_cpu_us_per_write", "server CPU per session written, µs"),
                    ("server_cpu_us_per_read", "server CPU per HGETALL, µs")]:
    z, r = med("zipcache", field), med("redis", field)
    print(f"| {name} | {z:.2f} | {r:.2f} | {z / r:.2f}x |")
wrong = sum(t["wrong"] for run in rows for t in run.values())
print(f"\n{rows[0]['zipcache']['written']:,} sessions written per run; wrong or partial "
      f"sessions read back: {wrong}; Redis held {med('redis', 'whole_per_dram_mib'):,.0f} "
      f"per MiB of DRAM.\n")
PY
}

# a. Sessions held, DRAM only.
skip a || runs_table dram "$SESSIONS" whole hset_per_second hgetall_per_second

# c. Through the SSD tier.
skip c || {
"$BIN" bench sessions --sessions "$SSD_SESSIONS" --dram "$DRAM" --ssd "$SSD" \
    --targets zipcache --set flush_wait_ms=60000 --out "$OUT/ssd" >"$OUT/ssd.txt"
python3 - "$OUT" >>"$summary" <<'PY'
import json, sys
ssd = json.load(open(f"{sys.argv[1]}/ssd/sessions.json"))[0]
print(f"Through the SSD tier ({ssd['ssd_bytes'] / 2**20:.0f} MiB of flash behind "
      f"{ssd['dram_bytes'] / 2**20:.0f} MiB of DRAM, {ssd['written']:,} sessions): "
      f"{ssd['whole']:,} held whole, {ssd['wrong']} wrong; "
      f"{ssd['whole_per_ssd_mib']:,.0f} per MiB of flash.\n")
PY
}

# d. Real records as hashes.
skip d || {
"$BIN" bench sessions --values records --sessions "$RECORDS" --dram "$DRAM" \
    --out "$OUT/records" >"$OUT/records.txt"
python3 - "$OUT" >>"$summary" <<'PY'
import json, sys
rows = {t["target"]: t for t in json.load(open(f"{sys.argv[1]}/records/sessions.json"))}
z, r = rows["zipcache"], rows["redis"]
print(f"Real records as hashes ({z['written']:,} written, {z['session_bytes']:.0f} B of fields "
      f"each): ZipCache {z['whole']:,} whole, Redis {r['whole']:,} "
      f"({z['whole'] / r['whole']:.2f}x); wrong: {z['wrong'] + r['wrong']}; HSET "
      f"{z['hset_per_second'] / r['hset_per_second']:.2f}x, HGETALL "
      f"{z['hgetall_per_second'] / r['hgetall_per_second']:.2f}x.\n")
PY
}

# e. Every session held by both: rates and CPU of hits alike.
skip e || {
    echo "Every session held (part e):" >>"$summary"
    echo >>"$summary"
    runs_table held "$HELD_SESSIONS" whole hset_per_second hgetall_per_second
}

# b. redis-benchmark HSET (one large hash) and HGETALL (one session).
skip b && { cat "$summary"; exit 0; }
start() { # $1: name, $2: port
    case $1 in
        zipcache)
            rm -rf "$OUT/rb-zipcache"
            "$BIN" serve --listen 127.0.0.1 --memcached-port off --resp-port "$2" --ssd none \
                --dram "$DRAM" --data-dir "$OUT/rb-zipcache" >"$OUT/rb-zipcache.log" 2>&1 &
            ;;
        redis)
            redis-server --port "$2" --bind 127.0.0.1 --maxmemory "${DRAM_MIB}mb" \
                --maxmemory-policy allkeys-lru --save '' --appendonly no >"$OUT/rb-redis.log" 2>&1 &
            ;;
    esac
    PIDS+=($!)
    wait_port "$2" 20
}
{
    echo "redis-benchmark -n $BENCH_N -P 16, requests per second:"
    echo
    echo "| | HSET (-t hset -r 100000: one hash) | HGET of one of its fields | HGETALL of a 12-field session |"
    echo "|---|---|---|---|"
} >>"$summary"
# The last "N requests per second" redis-benchmark printed.
rps() { awk '{for (i = 1; i < NF; i++) if ($(i + 1) == "requests") n = $i} END {print n}'; }
port=7721
for target in zipcache redis; do
    start "$target" "$port"
    hset=$(redis-benchmark -h 127.0.0.1 -p "$port" -t hset -n "$BENCH_N" -P 16 -q -r 100000 \
        2>&1 | tr '\r' '\n' | rps)
    hget=$(redis-benchmark -h 127.0.0.1 -p "$port" -n "$BENCH_N" -P 16 -q -r 100000 \
        HGET myhash 'element:__rand_int__' 2>&1 | tr '\r' '\n' | rps)
    fields=()
    for f in $(seq 12); do fields+=("sessionAttr:field$f" "value-$f-$(printf '%032d' "$f")"); done
    redis-cli -p "$port" HSET session:1 "${fields[@]}" >/dev/null
    hgetall=$(redis-benchmark -h 127.0.0.1 -p "$port" -n "$BENCH_N" -P 16 -q \
        HGETALL session:1 2>&1 | tr '\r' '\n' | rps)
    echo "| $target | $hset | $hget | $hgetall |" >>"$summary"
    kill "${PIDS[-1]}"
    unset 'PIDS[-1]'
    port=$((port + 1))
done
cat "$summary"

#!/usr/bin/env bash
# Hit ratio on real key traces with real-data values (the hit ratio on each cache2k
# trace with real-data values, at equal DRAM and against memcached with 3× the DRAM). Each trace is
# replayed look-aside, sequentially (one client, one request in flight, no backend wait:
# each request sees every earlier one, as in a cache simulator), every key's value a JSON
# document of the bench's real-data source (`--values json`; a key's document is derived
# from its id). Per trace, one bench invocation replays it against `zipcache serve`
# (started by the bench), memcached and the in-process engine at the same DRAM, and a
# second against memcached at MULT × that DRAM.
#
#   scripts/trace-real-values.sh TRACE_DIR             # the four cache2k traces
#   TRACES="web07:4" scripts/trace-real-values.sh DIR  # one trace at 4 MiB
#
# TRACE_DIR holds cache2k-<name>.trace.xz (the traces are not shipped with the project:
# CC BY 4.0, headissue GmbH / Jens Wilke, from the Caffeine simulator's resources).
# Environment: TRACES ("name:MiB ..."), MULT (3), VALUES (json), OUT (a fresh temp dir),
# NO_BUILD (0), BIN (target/release/zipcache). A bench, not a test: CI does not run it.
set -euo pipefail
cd "$(dirname "$0")/.."

DIR=${1:?usage: scripts/trace-real-values.sh TRACE_DIR}
TRACES=${TRACES:-"web07:4 web12:4 orm-busy:8 orm-night:8"}
MULT=${MULT:-3}
VALUES=${VALUES:-json}
BIN=${BIN:-target/release/zipcache}
OUT=${OUT:-$(mktemp -d /tmp/zipcache-trace-values.XXXXXX)}
mkdir -p "$OUT"
[ "${NO_BUILD:-0}" = 1 ] || cargo build --release -p zipcache-cli >&2

SEQ=(--threads 1 --connections 1 --pipeline 1 --backend-latency-us 0)
replay() { # NAME MIB TARGETS JSON
    "$BIN" bench --target "$3" --trace "$DIR/cache2k-$1.trace.xz" --trace-format caffeine-u32 \
        --dram "$2MiB" --ssd none --values "$VALUES" "${SEQ[@]}" --json "$4" >&2
}

report="$OUT/trace-real-values.md"
{
    echo "| trace | DRAM | target | hit | objects | memory used MiB |"
    echo "|---|---:|---|---:|---:|---:|"
} >"$report"
for spec in $TRACES; do
    name=${spec%%:*}
    mib=${spec##*:}
    big=$((mib * MULT))
    echo "trace $name: $mib MiB, memcached also at $big MiB" >&2
    replay "$name" "$mib" zipcache-serve,memcached,zipcache "$OUT/$name-$mib.json"
    replay "$name" "$big" memcached "$OUT/$name-$big.json"
    for f in "$OUT/$name-$mib.json" "$OUT/$name-$big.json"; do
        python3 - "$f" "$name" >>"$report" <<'EOF'
import json, sys
for r in json.load(open(sys.argv[1])):
    mib = r["workload"]["dram"] / 2**20
    used = r["dram_bytes_used"] / 2**20 if r["dram_bytes_used"] else float("nan")
    print(f"| {sys.argv[2]} | {mib:g} MiB | {r['target']} | {100 * r['hit_ratio']:.1f} % "
          f"| {r['objects_resident']:,} | {used:.1f} |")
EOF
    done
done
cat "$report"
echo "wrote $report" >&2

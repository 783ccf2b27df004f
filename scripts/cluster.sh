#!/usr/bin/env bash
# A ZipCache fleet as a Redis Cluster (`--cluster-mode on`, docs/SERVER.md "A fleet"):
# the figures of RESULTS.md's "A fleet of three nodes", written to OUTDIR/summary.md.
# A bench, not a test: CI does not run it (tests/cluster_fleet.rs is the test).
#
#   a. objects held: `zipcache bench --mode fill` through the cluster protocol into three
#      nodes of DRAM MiB each (`--target zipcache-cluster`: the bench starts them and
#      pushes an even split of the slots with CLUSTERX SETNODES, as kvrocks-controller
#      does) beside one such node owning every slot (`zipcache-node`), RUNS runs each of JSON
#      documents and of synthetic values; objects per node;
#   b. redis-benchmark --cluster (SET and GET, -P 16) against three nodes started here
#      (the topology pushed with redis-cli) beside plain redis-benchmark against one
#      node: on this 2-core machine the fleet shares the cores, so this says what the
#      routing costs, not what three machines would serve.
#
#   scripts/cluster.sh OUTDIR
#
# Environment: RUNS (3), DRAM (16MiB), KEYS (1500000), BENCH_N (400000), SKIP (letters of
# parts not to run, e.g. "a"), NO_BUILD (0), BIN (target/release/zipcache). About 6
# minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib/memcached-port.sh
source scripts/lib/memcached-port.sh

OUT=${1:?usage: scripts/cluster.sh OUTDIR}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
RUNS=${RUNS:-3}
DRAM=${DRAM:-16MiB}
KEYS=${KEYS:-1500000}
BENCH_N=${BENCH_N:-400000}
BIN=${BIN:-target/release/zipcache}
[ "${NO_BUILD:-0}" = 1 ] || cargo build --release -q -p zipcache-cli
BIN=$(realpath "$BIN")
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done' EXIT

summary="$OUT/summary.md"
{
    echo "# A fleet of three nodes ($(date -u +%F), $(nproc) cores, $(git rev-parse --short HEAD))"
    echo
} >"$summary"

skip() { [[ "${SKIP:-}" == *"$1"* ]]; }

# a. Objects held by three nodes against one.
skip a || {
echo "values,run,fleet_objects,node_objects,ratio,per_node" >"$OUT/objects.csv"
for values in json synthetic; do
    for run in $(seq "$RUNS"); do
        case $values in
            json) value_args=(--values json) ;;
            *) value_args=(--value-size 200) ;;
        esac
        json="$OUT/fill-$values-$run.json"
        (cd "$OUT" && "$BIN" bench --target zipcache-cluster,zipcache-node --mode fill \
            --ssd none --dram "$DRAM" --keys "$KEYS" "${value_args[@]}" --json "$json" \
            >"$OUT/fill-$values-$run.txt")
        python3 - "$json" "$values" "$run" >>"$OUT/objects.csv" <<'PY'
import json, sys
rows = {r["target"]: r for r in json.load(open(sys.argv[1]))}
fleet, node = rows["zipcache-cluster"], rows["zipcache-node"]
per_node = " ".join(str(n) for n in fleet["objects_per_node"])
print(f'{sys.argv[2]},{sys.argv[3]},{fleet["objects_resident"]},{node["objects_resident"]},'
      f'{fleet["objects_resident"] / node["objects_resident"]:.3f},{per_node}')
PY
    done
done
python3 - "$OUT/objects.csv" >>"$summary" <<'PY'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1])))
print("| values | fleet objects (median) | one node (median) | fleet / node (median) | per node, last run |")
print("|---|---|---|---|---|")
for values in ["json", "synthetic"]:
    rs = [r for r in rows if r["values"] == values]
    med = lambda k: statistics.median(float(r[k]) for r in rs)
    print(f'| {values} | {med("fleet_objects"):.0f} | {med("node_objects"):.0f} | '
          f'{med("ratio"):.2f}x | {rs[-1]["per_node"]} |')
print()
PY
}

# b. redis-benchmark --cluster on three nodes, and on one.
start_node() { # $1: RESP port, $2: data dir, then extra flags
    local port=$1 dir=$2
    shift 2
    "$BIN" serve --listen 127.0.0.1 --memcached-port off --resp-port "$port" --ssd none \
        --dram "$DRAM" --data-dir "$dir" "$@" >"$dir.log" 2>&1 &
    PIDS+=($!)
    wait_port "$port" 20
}
skip b && exit 0
ports=(7701 7702 7703)
lines=""
for i in 0 1 2; do
    rm -rf "$OUT/node$i"
    start_node "${ports[$i]}" "$OUT/node$i" --cluster-mode on
    first=$((i * 5461))
    last=$(( i == 2 ? 16383 : (i + 1) * 5461 - 1 ))
    id=$(printf 'scriptnode%dz%028d' "$i" 0)
    lines+="$id 127.0.0.1 ${ports[$i]} master - $first-$last"$'\n'
done
for i in 0 1 2; do
    id=$(printf 'scriptnode%dz%028d' "$i" 0)
    redis-cli -p "${ports[$i]}" CLUSTERX SETNODEID "$id" >/dev/null
    [ "$(redis-cli -p "${ports[$i]}" CLUSTERX SETNODES "$lines" 1)" = OK ]
done
fleet=$(redis-benchmark --cluster -h 127.0.0.1 -p "${ports[0]}" -t set,get -n "$BENCH_N" \
    -P 16 -q -r 100000 2>&1 | tr '\r' '\n' | grep 'requests per second')
for p in "${PIDS[@]}"; do kill "$p"; done
PIDS=()
rm -rf "$OUT/single"
start_node 7711 "$OUT/single"
single=$(redis-benchmark -h 127.0.0.1 -p 7711 -t set,get -n "$BENCH_N" -P 16 -q -r 100000 \
    2>&1 | tr '\r' '\n' | grep 'requests per second')
{
    echo "redis-benchmark -t set,get -n $BENCH_N -P 16 -r 100000, requests per second:"
    echo
    echo "| | SET | GET |"
    echo "|---|---|---|"
    rps() { awk -v op="$2:" '$1 == op {print $2}' <<<"$1"; }
    echo "| three nodes (--cluster) | $(rps "$fleet" SET) | $(rps "$fleet" GET) |"
    echo "| one node | $(rps "$single" SET) | $(rps "$single" GET) |"
} >>"$summary"
cat "$summary"

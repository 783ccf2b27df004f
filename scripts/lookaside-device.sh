#!/usr/bin/env bash
# The look-aside run at the 1:16 point through `zipcache serve`, with the block device
# and the CPUs sampled once a second (/proc/diskstats, /proc/stat) while the bench runs:
# device reads and writes per second, their mean latency, the mean queue depth, CPU idle
# and I/O wait, then each server thread's CPU time. Peers named in TARGETS run in the same
# bench (memcached-ext keeps its extstore file in the page cache: it reads no device).
# A bench, not a test: CI does not run it.
#
#   scripts/lookaside-device.sh                               # zipcache serve alone
#   TARGETS=memcached-ext scripts/lookaside-device.sh         # memcached-ext first, same run
#   DATA_DIR=/dev/shm/zc scripts/lookaside-device.sh          # the SSD file in RAM (tmpfs
#                                                             # takes O_DIRECT): no device
#   SERVE_ARGS="--set ssd_presence_filters=true" scripts/lookaside-device.sh
#   BENCH_ARGS="--threads 4 --connections 1 --pipeline 16" scripts/lookaside-device.sh
#                                                             # one pipelined connection per
#                                                             # bench thread: each reply is
#                                                             # timed as it arrives
#
# Environment: TARGETS (peers before the server, comma-separated; default none), DATA_DIR
# (a fresh temp dir), DEVICE (the disk under DATA_DIR, default: found with findmnt),
# SERVE_ARGS, BENCH_ARGS, PORT (22301), NO_BUILD (0), BIN (target/release/zipcache).
set -euo pipefail
cd "$(dirname "$0")/.."

PORT=${PORT:-22301}
BIN=${BIN:-target/release/zipcache}
DATA_DIR=${DATA_DIR:-$(mktemp -d /tmp/zipcache-lookaside.XXXXXX)}
read -r -a SERVE_ARGS <<<"${SERVE_ARGS:-}"
read -r -a BENCH_ARGS <<<"${BENCH_ARGS:-}"
TARGETS=${TARGETS:+$TARGETS,}zipcache://127.0.0.1:$PORT
if [ -z "${DEVICE:-}" ]; then
    source=$(findmnt -n -o SOURCE --target "$DATA_DIR")
    DEVICE=$(basename "$source")
fi
SAMPLES=$(mktemp /tmp/zipcache-lookaside-samples.XXXXXX)

[ "${NO_BUILD:-0}" = 1 ] || cargo build --release -p zipcache-cli >&2

rm -rf "$DATA_DIR/server" && mkdir -p "$DATA_DIR/server" "$DATA_DIR/bench"
"$BIN" serve --listen 127.0.0.1 --memcached-port "$PORT" --resp-port 0 --dram 3906KiB \
    --ssd-size 250000KiB --data-dir "$DATA_DIR/server" "${SERVE_ARGS[@]}" >/dev/null &
SPID=$!
trap 'kill "$SPID" 2>/dev/null || true' EXIT
sleep 1
"$BIN" bench --target "$TARGETS" --data-dir "$DATA_DIR/bench" --dram 3906KiB \
    --ssd-size 250000KiB --keys 800000 --value-size 64 --locality moderate \
    --warmup-ops 800000 --duration 8 --backend-latency-us 1000 "${BENCH_ARGS[@]}" &
BPID=$!
while kill -0 "$BPID" 2>/dev/null; do
    # reads, read ms, writes, write ms, busy ms, weighted ms; then the cpu line
    echo "$(date +%s.%N) $(awk -v d="$DEVICE" '$3==d {print $4, $7, $8, $11, $13, $14}' \
        /proc/diskstats) $(head -1 /proc/stat)" >>"$SAMPLES"
    sleep 1
done
wait "$BPID"
echo "== server threads by name, CPU seconds (user + system)"
cat /proc/"$SPID"/task/*/stat | awk '
    { cpu[$2] += ($14 + $15) / 100 }
    END { for (name in cpu) printf "%s %.2f\n", name, cpu[name] }' | sort
echo "== $DEVICE and CPUs, per second of the run (the last 8 lines are the measured phase)"
awk '
    NF < 16 { next }
    {
        t = $1; r = $2; rms = $3; w = $4; wms = $5; busy = $6; q = $7
        total = 0; for (i = 9; i <= 16; i++) total += $i; idle = $12; iowait = $13
        if (seen) {
            dt = t - pt; dr = r - pr; dw = w - pw; dtotal = total - ptotal
            printf "reads/s %6.0f  writes/s %5.0f  read lat %4.0f us  write lat %4.0f us  queue %5.1f  busy %3.0f %%  cpu idle %3.0f %%  iowait %3.0f %%\n",
                dr / dt, dw / dt, dr ? (rms - prms) / dr * 1000 : 0, dw ? (wms - pwms) / dw * 1000 : 0,
                (q - pq) / dt / 1000, (busy - pbusy) / dt / 10,
                dtotal ? (idle - pidle) / dtotal * 100 : 0, dtotal ? (iowait - piowait) / dtotal * 100 : 0
        }
        seen = 1; pt = t; pr = r; prms = rms; pw = w; pwms = wms; pbusy = busy; pq = q
        ptotal = total; pidle = idle; piowait = iowait
    }' "$SAMPLES"
rm -f "$SAMPLES"

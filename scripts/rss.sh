#!/usr/bin/env bash
# RSS of `zipcache serve` against its DRAM budget: fill a DRAM-only server
# through the memcached protocol, read its RSS, churn it for DURATION seconds (sets,
# overwrites with other value sizes, deletes, gets), read its RSS again, stop it.
# Budget: RSS <= 1.05 x DRAM + 24 MiB. A bench, not a test: CI does not run it.
#
#   scripts/rss.sh                      # 64 MiB, 3 M keys of 64 B, 600 s of churn
#   DURATION=60 scripts/rss.sh          # a shorter churn
#   SERVERS="zipcache memcached" scripts/rss.sh   # also memcached -m 64, same fill and churn
#
# Environment: DURATION (600), DRAM_MIB (64), KEYS (3000000), VALUE_SIZE (64), ETA (0.5),
# SERVERS (zipcache), SERVE_ARGS (more `zipcache serve` flags, e.g. "--set rss_limit=0" to
# see RSS without the governor), NO_BUILD (0), BIN (target/release/zipcache), LOG_DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib/memcached-port.sh
source scripts/lib/memcached-port.sh

DURATION=${DURATION:-600}
DRAM_MIB=${DRAM_MIB:-64}
KEYS=${KEYS:-3000000}
VALUE_SIZE=${VALUE_SIZE:-64}
ETA=${ETA:-0.5}
SERVERS=${SERVERS:-zipcache}
read -r -a SERVE_ARGS <<<"${SERVE_ARGS:-}"
BIN=${BIN:-target/release/zipcache}
SIZES=scripts/rss-churn-sizes.txt
LOG_DIR=${LOG_DIR:-$(mktemp -d /tmp/zipcache-rss.XXXXXX)}

[ "${NO_BUILD:-0}" = 1 ] || cargo build --release -p zipcache-cli >&2

SPID=""
cleanup() {
    # Only the server this script started, by its PID.
    if [ -n "$SPID" ] && kill -0 "$SPID" 2>/dev/null; then
        kill "$SPID"
        wait "$SPID" 2>/dev/null || true
    fi
}
trap cleanup EXIT

free_port() {
    # A port the kernel just handed out and nobody listens on.
    local port
    while :; do
        port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
        ss -ltn | awk '{print $4}' | grep -q ":$port\$" || { echo "$port"; return; }
    done
}

kib() { awk -v f="$2" '$1 == f":" {print $2}' "/proc/$1/status"; }

ROWS=()
# One row of the table: server, phase, its RSS now and at peak, and what it holds.
measure() {
    local server=$1 phase=$2 port=$3 s rss hwm objects used withheld
    s=$(stats "$port")
    rss=$(kib "$SPID" VmRSS)
    hwm=$(kib "$SPID" VmHWM)
    objects=$(stat "$s" curr_items)
    used=$(stat "$s" dram_used)
    [ -n "$used" ] || used=$(stat "$s" bytes)
    withheld=$(stat "$s" dram_withheld_bytes)
    ROWS+=("$(awk -v srv="$server" -v ph="$phase" -v rss="$rss" -v hwm="$hwm" -v obj="$objects" \
        -v used="$used" -v wh="${withheld:-0}" -v dram="$DRAM_MIB" 'BEGIN {
            limit = 1.05 * dram + 24
            printf "%-10s %-12s %8.1f %9.1f %9.1f %10.1f %12.1f %9d %8d  %s",
                srv, ph, rss / 1024, hwm / 1024, limit, used / 1048576, wh / 1048576, obj, obj / dram,
                (rss / 1024 <= limit ? "yes" : "NO")
        }')")
}

run() {
    local server=$1 port scheme
    port=$(free_port)
    case $server in
    zipcache)
        "$BIN" serve --listen 127.0.0.1 --memcached-port "$port" --resp-port 0 \
            --dram "${DRAM_MIB}MiB" --ssd none "${SERVE_ARGS[@]}" >"$LOG_DIR/serve.log" 2>&1 &
        scheme=zipcache ;;
    memcached)
        # -U 0: no UDP port to collide with; memcached will not run as root without -u.
        local user=()
        [ "$(id -u)" != 0 ] || user=(-u nobody)
        memcached -l 127.0.0.1 -p "$port" -U 0 -m "$DRAM_MIB" "${user[@]}" \
            >"$LOG_DIR/memcached.log" 2>&1 &
        scheme=memcached ;;
    *)
        echo "SERVERS: zipcache or memcached, not $server" >&2
        exit 2 ;;
    esac
    SPID=$!
    wait_port "$port" 10
    local target="$scheme://127.0.0.1:$port"
    measure "$server" start "$port"
    echo "$server (pid $SPID, port $port): fill of $KEYS keys" >&2
    "$BIN" bench --target "$target" --server-pid "$SPID" --mode fill --ssd none \
        --dram "${DRAM_MIB}MiB" --keys "$KEYS" --value-size "$VALUE_SIZE" --eta "$ETA" \
        | tee "$LOG_DIR/$server-fill.txt" >&2
    measure "$server" fill "$port"
    if [ "$DURATION" -gt 0 ]; then
        echo "$server: ${DURATION}s of churn" >&2
        "$BIN" bench --target "$target" --server-pid "$SPID" --mode lookaside --ssd none \
            --dram "${DRAM_MIB}MiB" --keys "$KEYS" --eta "$ETA" \
            --value-size "$VALUE_SIZE" --overwrite-size-file "$SIZES" \
            --get-ratio 0.5 --put-ratio 0.35 --delete-ratio 0.15 \
            --locality zero --backend-latency-us 0 \
            --duration "$DURATION" --time-limit $((DURATION + 60)) \
            | tee "$LOG_DIR/$server-churn.txt" >&2
        measure "$server" "churn ${DURATION}s" "$port"
    fi
    kill "$SPID"
    wait "$SPID" 2>/dev/null || true
    SPID=""
}

for server in $SERVERS; do
    run "$server"
done

echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo); logs in $LOG_DIR"
printf "%-10s %-12s %8s %9s %9s %10s %12s %9s %8s  %s\n" \
    server phase rss_MiB peak_MiB limit_MiB used_MiB withheld_MiB objects obj/MiB within
printf "%s\n" "${ROWS[@]}"

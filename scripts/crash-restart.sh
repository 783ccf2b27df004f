#!/usr/bin/env bash
# Crash restarts of `zipcache serve` (the crash journal, docs/FORMAT.md "The crash
# journal"): three figures, each written to OUTDIR as CSV and summed up in
# OUTDIR/summary.md. A bench, not a test: CI does not run it (tests/crash.rs is the test).
#
#   a. kill -9 under a write load (tests/crash.rs of zipcache-cli, release): untouched
#      keys served after each kill, hot keys served (none stale, or the test fails),
#      restart time;
#   b. start to serving after kill -9 with ~6 M small objects on a 2 GiB SSD: fill
#      through the memcached port (`zipcache bench --mode fill`), kill -9, restart; wall
#      time from spawn to the first reply to `mg`, the server's recovery_ms and
#      recovery_objects; then a look-aside pass that checks every value it reads;
#   c. the journal's cost, crash_journal=off against on (the default: /dev/shm, here a
#      directory of its own in /dev/shm), runs alternating, RUNS of each, medians:
#      (i) in-process `zipcache bench --mode fill` (bench_cpu_seconds per SET), (ii) the
#      same through `zipcache serve` (server_cpu_seconds per SET); flash bytes written
#      (host_bytes_written) and DRAM bytes of the shadow table per SSD object. With
#      BASE_BIN (a `zipcache` built from the commit before the crash journal) a third
#      configuration, `base`, runs beside them.
#
#   scripts/crash-restart.sh OUTDIR
#
# Environment: RUNS (3), B_KEYS (7600000), B_JOURNAL_BYTES (24MiB: the default 8 MiB
# fills up during this fill, so the restart would be cold), C_KEYS (2000000 in-process),
# C_SERVER_KEYS (1000000), C_DRAM (32MiB), C_SSD (512MiB), C_VALUE_SIZE (64), SKIP (letters
# of figures not to run, e.g. "ac"), NO_BUILD (0), BIN (target/release/zipcache), BASE_BIN,
# C_SET (engine settings NAME=VALUE, space-separated, for every run of c, e.g.
# "ssd_presence_filters=true"), C_VALUES (the bench's --values for c, e.g. json;
# default: C_VALUE_SIZE bytes of synthetic values).
# About 13 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib/memcached-port.sh
source scripts/lib/memcached-port.sh

OUT=${1:?usage: scripts/crash-restart.sh OUTDIR}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
RUNS=${RUNS:-3}
B_KEYS=${B_KEYS:-7600000}
B_JOURNAL_BYTES=${B_JOURNAL_BYTES:-24MiB}
C_KEYS=${C_KEYS:-2000000}
C_SERVER_KEYS=${C_SERVER_KEYS:-1000000}
C_DRAM=${C_DRAM:-32MiB}
C_SSD=${C_SSD:-512MiB}
C_VALUE_SIZE=${C_VALUE_SIZE:-64}
SKIP=${SKIP:-}
BIN=$(realpath "${BIN:-target/release/zipcache}")
BASE_BIN=${BASE_BIN:-}

[ "${NO_BUILD:-0}" = 1 ] || cargo build --release -p zipcache-cli >&2

# The crash journal lives in tmpfs, as by default, in a directory of its own; the data
# on disk. Both removed at exit.
JOURNALS=$(mktemp -d /dev/shm/zipcache-crash-restart.XXXXXX)
DATA=$(mktemp -d "${TMPDIR:-/tmp}/zipcache-crash-restart.XXXXXX")
SPID=""
cleanup() {
    # Only the server this script started, by its PID.
    if [ -n "$SPID" ]; then
        stop_pid KILL "$SPID" || true
    fi
    rm -rf "$JOURNALS" "$DATA"
}
trap cleanup EXIT

# Sends signal $1 to the server of PID $2 (this script's) and waits until it is gone: a
# server spawned by `spawn_timed` is not this shell's child, so `wait` cannot reap it.
stop_pid() {
    kill "-$1" "$2" 2>/dev/null || return 0
    wait "$2" 2>/dev/null || true
    for _ in $(seq 1200); do
        kill -0 "$2" 2>/dev/null || return 0
        sleep 0.1
    done
    echo "server $2 still running 120 s after SIG$1" >&2
    return 1
}

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# A field of the first object of a bench JSON file: json FILE EXPR (python, `d` the object).
json() {
    python3 -c 'import json, sys; d = json.load(open(sys.argv[1]))[0]; print(eval(sys.argv[2]))' "$1" "$2"
}

# Starts the command $3... (a `zipcache serve` listening on 127.0.0.1:$2), writes its PID
# to $1 and its output beside it (.log), and prints the seconds from the spawn to the first
# reply to `mg` and that reply's kind (VA: a value, EN: a miss).
spawn_timed() {
    python3 - "$@" <<'PY'
import socket, subprocess, sys, time
pidfile, port, cmd = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
start = time.monotonic()
log = open(pidfile[:-4] + ".log", "wb")
proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
with open(pidfile, "w") as f:
    f.write(str(proc.pid))
while True:
    if proc.poll() is not None:
        sys.exit(f"zipcache serve exited ({proc.returncode})")
    if time.monotonic() - start > 120:
        sys.exit("no reply within 120 s")
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=60)
    except OSError:
        time.sleep(0.002)
        continue
    # The bench's key 0: written first, on flash.
    s.sendall(b"mg 0000000000000000 v\r\n")
    reply = s.makefile("rb").readline().split()
    print(f"{time.monotonic() - start:.3f} {reply[0].decode() if reply else 'closed'}")
    break
PY
}

median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{v[NR]=$1} END {print (NR%2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2)}'; }

SUMMARY="$OUT/summary.md"
{
    echo "# Crash restarts of zipcache serve"
    echo
    echo "$(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, $(uname -r), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
    echo
} >"$SUMMARY"

# ---------------------------------------------------------------- a. kill -9 under load
if [[ $SKIP != *a* ]]; then
    echo "a. kill -9 under a write load (tests/crash.rs)" >&2
    cargo test --release -p zipcache-cli --test crash -- --nocapture >"$OUT/a-test.log" 2>&1 || {
        cat "$OUT/a-test.log" >&2
        exit 1
    }
    # One line per kill (ZIPCACHE_SERVER_CRASH_ROUNDS, default 2), as the test prints it.
    {
        echo "round,written_down_after_s,marked_at_kill,dram_objects_at_kill,dirty_at_kill,ssd_objects_at_kill,untouched_served,untouched_percent,hot_served,listening_s,recovery_objects,hidden_keys,recovery_ms"
        grep -a '^round [0-9]*: ' "$OUT/a-test.log" | python3 -c '
import re, sys
for line in sys.stdin:
    n = lambda pattern: re.search(pattern, line).group(1)
    units = {"ns": 1e-9, "µs": 1e-6, "ms": 1e-3, "s": 1.0}
    seconds = lambda text: next(float(text[: -len(u)]) * f for u, f in units.items() if text.endswith(u))
    print(",".join([n(r"^round (\d+)"), str(seconds(n(r"written down (\S+) into"))), n(r"kill (\d+) keys marked"),
        n(r"marked, (\d+) DRAM"), n(r"\((\d+) dirty\)"), n(r"dirty\), (\d+) SSD"), n(r"serves (\d+)/"), n(r"\(([\d.]+) %\)"),
        n(r"(\d+)/\d+ hot"), str(seconds(n(r"listening (\S+) after"))), n(r"recovery (\d+) objects"),
        n(r"objects, (\d+) keys hidden"), n(r"stale, ([\d.]+) ms")]))
'
    } >"$OUT/a-kill9.csv"
    {
        echo "## a. kill -9 under a write load (\`cargo test --release -p zipcache-cli --test crash\`)"
        echo
        echo "--dram 4MiB --ssd-size 256MiB (the crash journal at its default size, dram/16); 200,000 keys filled and verified, then pipelined sets and deletes over 50,000 other keys; kill -9 once the load has written most of the fill down (dirty DRAM objects under 50,000) and the shadow table is whole, and again after the restart; the test asserts 95 % of the untouched keys on flash at the kill (at least the keys minus the dirty DRAM objects) served."
        echo
        echo '```'
        grep -a '^round [0-9]*: ' "$OUT/a-test.log"
        echo '```'
        echo
    } >>"$SUMMARY"
fi

# ------------------------------------------------- b. start to serving with ~6 M objects
if [[ $SKIP != *b* ]]; then
    echo "b. $B_KEYS keys through the server, kill -9, restart" >&2
    PORT=$(free_port)
    mkdir -p "$JOURNALS/b"
    SERVE=("$BIN" serve --memcached-port "$PORT" --resp-port off --dram 128MiB --ssd-size 2GiB
        --threads 2 --set "crash_journal=$JOURNALS/b" --set "crash_journal_bytes=$B_JOURNAL_BYTES"
        --set flush_wait_ms=60000 --data-dir "$DATA/b")
    "${SERVE[@]}" >"$OUT/b-serve-1.log" 2>&1 &
    SPID=$!
    wait_port "$PORT" 30
    "$BIN" bench --target "zipcache://127.0.0.1:$PORT" --mode fill --keys "$B_KEYS" --value-size 100 \
        --server-pid "$SPID" --json "$OUT/b-fill.json" >"$OUT/b-fill.txt" 2>&1
    before=$(stats "$PORT")
    echo "$before" >"$OUT/b-stats-before-kill.txt"
    stop_pid KILL "$SPID"
    SPID=""
    # Spawned by the helper, which writes its PID and times spawn → first reply to `mg`.
    first=$(spawn_timed "$OUT/b-serve-2.pid" "$PORT" "${SERVE[@]}") || {
        SPID=$(cat "$OUT/b-serve-2.pid" 2>/dev/null || true)
        exit 1
    }
    SPID=$(cat "$OUT/b-serve-2.pid")
    after=$(stats "$PORT")
    echo "$after" >"$OUT/b-stats-after-restart.txt"
    # Every value read is checked (wrong_values); a miss is filled, as look-aside does.
    "$BIN" bench --target "zipcache://127.0.0.1:$PORT" --mode lookaside --keys "$B_KEYS" \
        --value-size 100 --locality zero --ops 300000 --backend-latency-us 0 \
        --server-pid "$SPID" --json "$OUT/b-verify.json" >"$OUT/b-verify.txt" 2>&1
    # For comparison: a clean stop (SIGTERM writes DRAM down, saves the indexes) and start.
    stop_pid TERM "$SPID"
    clean=$(spawn_timed "$OUT/b-serve-3.pid" "$PORT" "${SERVE[@]}") || {
        SPID=$(cat "$OUT/b-serve-3.pid" 2>/dev/null || true)
        exit 1
    }
    SPID=$(cat "$OUT/b-serve-3.pid")
    clean_stats=$(stats "$PORT")
    echo "$clean_stats" >"$OUT/b-stats-after-clean-restart.txt"
    stop_pid KILL "$SPID"
    SPID=""
    read -r clean_seconds clean_reply <<<"$clean"
    read -r seconds reply <<<"$first"
    objects=$(stat "$after" recovery_objects)
    ms=$(stat "$after" recovery_ms)
    per10m=$(awk -v ms="$ms" -v n="$objects" 'BEGIN {printf "%.0f", n ? ms * 1e7 / n : 0}')
    {
        echo "keys,ssd_objects_before_kill,dram_objects_before_kill,crash_journal_keys,crash_journal_incomplete,recovery_kind,recovery_objects,recovery_shadowed_keys,recovery_ms,recovery_ms_per_10M_objects,spawn_to_first_reply_s,first_reply,verify_hit_ratio,verify_wrong_values,clean_recovery_kind,clean_recovery_objects,clean_recovery_ms,clean_spawn_to_first_reply_s"
        echo "$B_KEYS,$(stat "$before" ssd_objects),$(stat "$before" dram_objects),$(stat "$before" crash_journal_keys),$(stat "$before" crash_journal_incomplete),$(stat "$after" recovery_kind),$objects,$(stat "$after" recovery_shadowed_keys),$ms,$per10m,$seconds,$reply,$(json "$OUT/b-verify.json" "d['hit_ratio']"),$(json "$OUT/b-verify.json" "d['wrong_values']"),$(stat "$clean_stats" recovery_kind),$(stat "$clean_stats" recovery_objects),$(stat "$clean_stats" recovery_ms),$clean_seconds"
    } >"$OUT/b-start-to-serving.csv"
    {
        echo "## b. start to serving after kill -9, ~6 M objects on a 2 GiB SSD"
        echo
        echo "\`zipcache serve --dram 128MiB --ssd-size 2GiB --threads 2 --set crash_journal=DIR --set crash_journal_bytes=$B_JOURNAL_BYTES --set flush_wait_ms=60000\`; \`zipcache bench --target zipcache://… --mode fill --keys $B_KEYS --value-size 100\`; kill -9; the same command again."
        echo
        echo "| ssd_objects at the kill | recovery | recovery_objects | hidden keys | recovery_ms | ms per 10 M objects | spawn → first \`mg\` reply | first reply | look-aside check: hit ratio, wrong |"
        echo "|---:|---|---:|---:|---:|---:|---:|---|---|"
        echo "| $(stat "$before" ssd_objects) | $(stat "$after" recovery_kind) | $objects | $(stat "$after" recovery_shadowed_keys) | $ms | $per10m | $seconds s | $reply | $(json "$OUT/b-verify.json" "round(d['hit_ratio'], 4)"), $(json "$OUT/b-verify.json" "d['wrong_values']") |"
        echo "| (then SIGTERM and start) | $(stat "$clean_stats" recovery_kind) | $(stat "$clean_stats" recovery_objects) | $(stat "$clean_stats" recovery_shadowed_keys) | $(stat "$clean_stats" recovery_ms) | | $clean_seconds s | $clean_reply | |"
        echo
    } >>"$SUMMARY"
fi

# -------------------------------------------------------------------- c. journal cost
if [[ $SKIP != *c* ]]; then
    CONFIGS=(off on)
    [ -n "$BASE_BIN" ] && CONFIGS+=(base)
    CSV="$OUT/c-cost.csv"
    echo "where,config,run,sets,cpu_seconds,cpu_us_per_set,host_bytes_written,ssd_objects,crash_journal_bytes,dram_bytes_per_ssd_object,crash_journal_incomplete,elapsed_s,crash_journal_keys" >"$CSV"
    # The values of every fill: C_VALUES (a real-data source) or C_VALUE_SIZE synthetic bytes.
    if [ -n "${C_VALUES:-}" ]; then VALUE_ARGS=(--values "$C_VALUES"); else VALUE_ARGS=(--value-size "$C_VALUE_SIZE"); fi
    # The binary of a configuration, and its `--set` arguments for run $2 (one a line).
    config_bin() { if [ "$1" = base ]; then echo "$BASE_BIN"; else echo "$BIN"; fi; }
    config_set() {
        for setting in ${C_SET:-}; do
            printf '%s\n' --set "$setting"
        done
        case $1 in
            off) printf '%s\n' --set crash_journal=off ;;
            on) mkdir -p "$JOURNALS/c-$2" && printf '%s\n' --set "crash_journal=$JOURNALS/c-$2" ;;
            base) ;;
        esac
    }
    for run in $(seq "$RUNS"); do
        for config in "${CONFIGS[@]}"; do
            echo "c(i). in-process fill, $config, run $run" >&2
            bin=$(config_bin "$config")
            mapfile -t set < <(config_set "$config" "in-$run")
            j="$OUT/c-in-process-$config-$run.json"
            "$bin" bench --target zipcache --mode fill --keys "$C_KEYS" "${VALUE_ARGS[@]}" \
                --dram "$C_DRAM" --ssd-size "$C_SSD" --data-dir "$DATA/c" --set flush_wait_ms=60000 \
                "${set[@]}" --json "$j" >"${j%.json}.txt" 2>&1
            rm -rf "${JOURNALS:?}/c-in-$run"
            echo "in-process,$config,$run,$(json "$j" "d['ops']"),$(json "$j" "d['bench_cpu_seconds']"),$(json "$j" "round(d['bench_cpu_seconds'] * 1e6 / d['ops'], 3)"),$(json "$j" "d['host_bytes_written']"),$(json "$j" "d['engine_stats']['ssd_objects']"),$(json "$j" "d['engine_stats'].get('crash_journal_bytes', 0)"),$(json "$j" "round(d['engine_stats'].get('crash_journal_bytes', 0) / max(1, d['engine_stats']['ssd_objects']), 3)"),$(json "$j" "d['engine_stats'].get('crash_journal_incomplete', '')"),$(json "$j" "round(d['elapsed_s'], 1)"),$(json "$j" "d['engine_stats'].get('crash_journal_keys', 0)")" >>"$CSV"
        done
    done
    for run in $(seq "$RUNS"); do
        for config in "${CONFIGS[@]}"; do
            echo "c(ii). fill through zipcache serve, $config, run $run" >&2
            bin=$(config_bin "$config")
            mapfile -t set < <(config_set "$config" "srv-$run")
            PORT=$(free_port)
            "$bin" serve --memcached-port "$PORT" --resp-port off --dram "$C_DRAM" --ssd-size "$C_SSD" \
                --threads 2 --set flush_wait_ms=60000 "${set[@]}" \
                --data-dir "$DATA/c-srv" >"$OUT/c-serve-$config-$run.log" 2>&1 &
            SPID=$!
            wait_port "$PORT" 30
            j="$OUT/c-server-$config-$run.json"
            "$BIN" bench --target "zipcache://127.0.0.1:$PORT" --mode fill --keys "$C_SERVER_KEYS" \
                "${VALUE_ARGS[@]}" --server-pid "$SPID" --json "$j" >"${j%.json}.txt" 2>&1
            s=$(stats "$PORT")
            stop_pid KILL "$SPID"
            SPID=""
            rm -rf "$DATA/c-srv" "${JOURNALS:?}/c-srv-$run"
            cj=$(stat "$s" crash_journal_bytes)
            so=$(stat "$s" ssd_objects)
            echo "server,$config,$run,$(json "$j" "d['ops']"),$(json "$j" "d['server_cpu_seconds']"),$(json "$j" "round(d['server_cpu_seconds'] * 1e6 / d['ops'], 3)"),$(json "$j" "d['host_bytes_written']"),$so,${cj:-0},$(awk -v a="${cj:-0}" -v b="$so" 'BEGIN {printf "%.3f", b ? a / b : 0}'),$(stat "$s" crash_journal_incomplete),$(json "$j" "round(d['elapsed_s'], 1)"),$(stat "$s" crash_journal_keys)" >>"$CSV"
        done
    done
    {
        echo "## c. cost of the crash journal: off vs on (default size, tmpfs)${BASE_BIN:+ vs base (before the journal)}"
        echo
        echo "Fill of $C_KEYS keys in-process (\`zipcache bench --target zipcache --mode fill --dram $C_DRAM --ssd-size $C_SSD ${VALUE_ARGS[*]} --set flush_wait_ms=60000${C_SET:+ --set }${C_SET:-}\`) and of $C_SERVER_KEYS keys through \`zipcache serve\` (same sizes and settings, \`--threads 2\`); $RUNS runs of each, alternating; medians. CPU: the bench process's (in-process, clients included) or the server's."
        echo
        echo "| where | config | CPU µs per SET | host bytes written | ssd_objects | crash_journal_bytes | DRAM B per SSD object | keys marked at the end | incomplete |"
        echo "|---|---|---:|---:|---:|---:|---:|---:|---|"
        for where in in-process server; do
            for config in "${CONFIGS[@]}"; do
                col() { awk -F, -v w="$where" -v c="$config" -v k="$1" 'NR > 1 && $1 == w && $2 == c {print $k}' "$CSV" | median; }
                inc=$(awk -F, -v w="$where" -v c="$config" 'NR > 1 && $1 == w && $2 == c {print $11}' "$CSV" | sort -u | tr '\n' ' ')
                echo "| $where | $config | $(col 6) | $(col 7) | $(col 8) | $(col 9) | $(col 10) | $(col 13) | $inc |"
            done
        done
        echo
    } >>"$SUMMARY"
fi

cat "$SUMMARY"

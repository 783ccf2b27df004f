#!/usr/bin/env bash
# Runs memcached's own test suite (`t/*.t` of a memcached source checkout) against
# `zipcache serve`, one fresh server per test file, and prints per-file TAP counts.
#
# Usage: memcached_t_suite.sh SRC_DIR [ZIPCACHE_BIN] [FILE.t ...]
#   SRC_DIR       a memcached source checkout (only its t/ directory is read)
#   ZIPCACHE_BIN  default: target/release/zipcache (or $CARGO_TARGET_DIR/release/zipcache)
#   FILE.t        run only these files (default: every t/*.t but the families below)
#
# Not run by default, as they test what `zipcache serve` does not speak: extstore
# (*extstore*.t), the proxy (proxy*.t), TLS (ssl*.t) and UDP (udp.t); nor unixsocket.t,
# which wants the socket at /tmp/memcachetest<its own PID> and, under T_MEMD_USE_DAEMON,
# still talks TCP (tests/unix_socket.rs covers the socket).
#
# Nothing is fetched. The harness (t/lib/MemcachedTest.pm) wants a `memcached-debug`
# in its working directory, whose `-h` output it reads to see which features exist:
# a link to the installed `memcached` stands in for it. With T_MEMD_USE_DAEMON set
# the harness connects to our server instead of starting memcached, and ignores the
# arguments a test asks for; the few that map to a `serve` flag are passed here
# (ascii-auth*.t: `-Y t/authfile*` -> `--auth-file`; maxconns.t and binary.t rely on
# memcached's default `-c 1024`; metaget.t checks the `h` and `l` flags, which need the engine's
# per-object access state, off by default: `--set track_access=true`; lru-crawler.t's
# `-o no_modern` starts memcached's LRU crawler disabled: `--disable-lru-crawler`;
# binary.t and stats.t check `stats settings` for the unix socket the harness starts
# memcached on by default (`-s`, where `memcached -h` lists it): `--unix-socket` beside
# the TCP port the harness connects to;
# binary-sasl.t's `-S` with a sasldb user: `--auth-file` with that user, and, as the
# file runs only with RUN_SASL_TESTS set and first writes memcached's sasldb with
# `saslpasswd2`, which we do not read, both set up: a `saslpasswd2` stand-in that
# writes nothing when the real one is not installed). Servers listen on 127.0.0.1 and are stopped by PID, on the ports
# the kernel picks, or on T_SUITE_PORT (memcached) and T_SUITE_PORT+1 (RESP) when set.
set -uo pipefail

src=$(cd "${1:?usage: $0 SRC_DIR [ZIPCACHE_BIN] [FILE.t ...]}" && pwd)
shift
here=$(cd "$(dirname "$0")/../../.." && pwd)
bin=${1:-${CARGO_TARGET_DIR:-$here/target}/release/zipcache}
[ $# -gt 0 ] && shift
[ -x "$bin" ] || { echo "no zipcache binary at $bin (cargo build --release -p zipcache-cli)" >&2; exit 2; }
memcached=$(command -v memcached) || { echo "memcached not installed (apt-get install memcached)" >&2; exit 2; }
[ -d "$src/t" ] || { echo "$src/t: not a memcached source checkout" >&2; exit 2; }

memcached_port=${T_SUITE_PORT:-0}
resp_port=$((memcached_port == 0 ? 0 : memcached_port + 1))
work=$(mktemp -d)
server_pid=""
stop_server() {
    if [ -n "$server_pid" ]; then
        kill "$server_pid" 2>/dev/null
        wait "$server_pid" 2>/dev/null
        server_pid=""
    fi
}
trap 'stop_server; rm -rf "$work"' EXIT
ln -s "$src/t" "$work/t"
ln -s "$memcached" "$work/memcached-debug"
# binary-sasl.t's user (its saslpasswd2 line: user `testuser` in realm `memcached.realm`,
# which its client sends as `testuser@memcached.realm`).
printf 'testuser@memcached.realm:testpass\n' >"$work/sasl-users"
mkdir "$work/bin"
command -v saslpasswd2 >/dev/null || printf '#!/bin/sh\ncat >/dev/null\n' >"$work/bin/saslpasswd2"
chmod +x "$work/bin/"* 2>/dev/null

# Serve flags standing in for the memcached arguments a test file asks for.
serve_flags() {
    case "$1" in
        ascii-auth.t) echo "--auth-file $src/t/authfile" ;;
        ascii-auth2.t) echo "--auth-file $src/t/authfile2" ;;
        maxconns.t) echo "--max-connections 1024" ;;
        metaget.t) echo "--set track_access=true" ;;
        lru-crawler.t) echo "--disable-lru-crawler" ;; # its `-o no_modern`
        stats.t) echo "--set max_value_size=1024 --max-connections 1024 --unix-socket $work/memcached.sock" ;;
        idle-timeout.t) echo "--idle-timeout 3" ;;
        dyn-maxbytes.t) echo "--dram 3MiB" ;;
        dash-M.t) echo "--set evictions=false --dram 128KiB" ;; # its `-M` (see SERVER.md)
        binary.t) echo "--max-connections 1024 --unix-socket $work/memcached.sock" ;;
        binary-sasl.t) echo "--auth-file $work/sasl-users" ;;
    esac
}

if [ $# -gt 0 ]; then
    files=("$@")
else
    files=()
    for f in "$src"/t/*.t; do
        name=$(basename "$f")
        case "$name" in
            *extstore* | proxy* | ssl* | udp.t | unixsocket.t) ;;
            *) files+=("$name") ;;
        esac
    done
fi

total_ok=0
total_not_ok=0
printf '%-28s %8s %8s %8s\n' file planned ok "not ok"
for file in "${files[@]}"; do
    log="$work/$file.log"
    : >"$log" # exists before the server writes to it, for the port lookup below
    flags=$(serve_flags "$file")
    # memcached's default -m 64, unless the file asks for its own.
    case " $flags " in
        *" --dram "*) ;;
        *) flags="--dram 64MiB $flags" ;;
    esac
    # shellcheck disable=SC2086  # the flags are words
    "$bin" serve --listen 127.0.0.1 --memcached-port "$memcached_port" --resp-port "$resp_port" --ssd none \
        --data-dir "$work/data" $flags >"$log" 2>&1 &
    server_pid=$!
    port=""
    for _ in $(seq 100); do
        port=$(sed -n 's/^listening memcached=127\.0\.0\.1:\([0-9]*\) .*/\1/p' "$log")
        [ -n "$port" ] || ! kill -0 "$server_pid" 2>/dev/null && break
        sleep 0.1
    done
    if [ -z "$port" ]; then
        printf '%-28s server did not start: %s\n' "$file" "$(head -1 "$log")"
        stop_server
        continue
    fi
    # A test that waits for a reply we never send (a feature we lack) is cut short.
    tap=$(cd "$work" && PATH="$work/bin:$PATH" RUN_SASL_TESTS=1 T_MEMD_USE_DAEMON=127.0.0.1:$port \
        timeout 120 perl "t/$file" 2>/dev/null | tr -d '\0')
    stop_server
    planned=$(printf '%s\n' "$tap" | sed -n 's/^1\.\.\([0-9]*\).*/\1/p' | head -1)
    ok=$(printf '%s\n' "$tap" | grep -c '^ok ')
    not_ok=$(printf '%s\n' "$tap" | grep -c '^not ok ')
    total_ok=$((total_ok + ok))
    total_not_ok=$((total_not_ok + not_ok))
    printf '%-28s %8s %8d %8d\n' "$file" "${planned:-?}" "$ok" "$not_ok"
done
printf '%-28s %8s %8d %8d\n' TOTAL "" "$total_ok" "$total_not_ok"

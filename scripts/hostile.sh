#!/usr/bin/env bash
# The 10-minute hostile run: `zipcache serve --dram 64MiB` with a 1 GiB SSD file, 1,000
# well-behaved clients beside hostile ones (amplified multi-gets, a 200,000-key MGET,
# slowloris, oversized declared lengths, connection churn, readers of large values that
# never read their replies). Writes
# rss.csv, rss.png and summary.json to OUT (default hostile-run/); every flag after OUT
# goes to `zipcache bench hostile` (e.g. --duration 60 for a shorter run).
# The server listens on 127.0.0.1 only and is stopped by its PID (SIGTERM) at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-hostile-run}"
shift || true
cargo build --release -p zipcache-cli
exec target/release/zipcache bench hostile --clients 1000 --duration 600 \
    --dram 64MiB --ssd-size 1GiB --out "$OUT" "$@"

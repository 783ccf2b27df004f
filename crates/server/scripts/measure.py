#!/usr/bin/env python3
"""Throughput and latency of `zipcache serve` beside memcached and Redis, same run,
same memory (64 MiB), all on 127.0.0.1. Prints a markdown table for docs/SERVER.md.

Usage: measure.py PATH/TO/zipcache [--quick]
Every server is started here and stopped by its PID.
"""
import csv
import io
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

ZIPCACHE = sys.argv[1]
QUICK = "--quick" in sys.argv
N = 20000 if QUICK else 200000
SECONDS = "3s" if QUICK else "10s"


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def wait_port(port):
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("nothing listens on %d" % port)


def redis_benchmark(port, pipeline):
    cmd = ["redis-benchmark", "-h", "127.0.0.1", "-p", str(port), "-t", "set,get",
           "-n", str(N), "-d", "64", "-r", "100000", "-c", "50", "-P", str(pipeline), "--csv"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600).stdout
    rows = {}
    for row in csv.DictReader(io.StringIO(out)):
        rows[row["test"]] = (float(row["rps"]), float(row["p50_latency_ms"]) * 1000,
                             float(row["p99_latency_ms"]) * 1000)
    return rows, " ".join(cmd)


def memcaslap(port):
    cmd = ["memcaslap", "-s", "127.0.0.1:%d" % port, "-T", "2", "-c", "32", "-t", SECONDS,
           "-X", "64", "-S", SECONDS]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120).stdout
    tps = float(re.search(r"TPS: (\d+)", out).group(1))
    total = out[out.rindex("Total Statistics"):]
    # Log2 histogram rows "k: c_k c_k+1 c_k+2 c_k+3": events in [2^i, 2^(i+1)) us.
    counts = {}
    for base, cells in re.findall(r"^\s+(\d+):((?:\s+\d+)+)$", total, re.M):
        for i, c in enumerate(cells.split()):
            counts[int(base) + i] = int(c)
    events = sum(counts.values())

    def pct(p):
        seen = 0
        for exp in sorted(counts):
            seen += counts[exp]
            if seen >= p * events:
                return 2 ** (exp + 1)
        return float("nan")
    return (tps, pct(0.5), pct(0.99)), " ".join(cmd)


def main():
    data = tempfile.mkdtemp(prefix="zipcache-measure-")
    targets = []
    procs = []
    try:
        mc, rs = free_port(), free_port()
        procs.append(subprocess.Popen(["memcached", "-u", "root", "-l", "127.0.0.1", "-p", str(mc),
                                       "-m", "64", "-t", "2"]))
        procs.append(subprocess.Popen(["redis-server", "--port", str(rs), "--bind", "127.0.0.1",
                                       "--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru",
                                       "--save", "", "--appendonly", "no"],
                                      stdout=subprocess.DEVNULL))
        targets.append(("memcached 1.6.18 (-t 2)", mc, None))
        targets.append(("redis 7.0.15", None, rs))
        for runtime in ["per-core", "shared"]:
            zm, zr = free_port(), free_port()
            procs.append(subprocess.Popen(
                [ZIPCACHE, "serve", "--memcached-port", str(zm), "--resp-port", str(zr),
                 "--dram", "64MiB", "--ssd", "none", "--data-dir", os.path.join(data, runtime),
                 "--threads", "2", "--runtime", runtime], stdout=subprocess.DEVNULL))
            targets.append(("zipcache serve --runtime %s" % runtime, zm, zr))
        for _, m, r in targets:
            for p in (m, r):
                if p:
                    wait_port(p)
        commands = set()
        print("| target | tool | ops/s | p50 µs | p99 µs |")
        print("|---|---|---:|---:|---:|")
        for name, m, r in targets:
            if r:
                for pipeline in (16, 1):
                    rows, cmd = redis_benchmark(r, pipeline)
                    commands.add(re.sub(r"-p \d+", "-p PORT", cmd))
                    for test, (rps, p50, p99) in rows.items():
                        print("| %s | redis-benchmark %s -P %d | %.0f | %.0f | %.0f |"
                              % (name, test, pipeline, rps, p50, p99))
            if m:
                (tps, p50, p99), cmd = memcaslap(m)
                commands.add(re.sub(r":\d+ ", ":PORT ", cmd))
                print("| %s | memcaslap 90%% get | %.0f | ≤%d | ≤%d |" % (name, tps, p50, p99))
        print()
        for cmd in sorted(commands):
            print("    " + cmd)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait()
        shutil.rmtree(data, ignore_errors=True)


main()

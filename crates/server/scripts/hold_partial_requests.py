"""The connection-buffer budget under load: starts `zipcache serve --dram 64MiB --ssd none`
on 127.0.0.1 (stopped by its PID at the end), opens 200 RESP connections that each send
all but the last 10 bytes of a 1.2 MB SET and hold, then prints the server's peak RSS,
how many connections are still open, and its counters.

Usage: hold_partial_requests.py ZIPCACHE_BINARY MEMCACHED_PORT RESP_PORT
"""
import socket, subprocess, sys, tempfile, time
binary, port_mc, port_resp = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
server = subprocess.Popen([binary, "serve", "--memcached-port", str(port_mc), "--resp-port", str(port_resp),
    "--dram", "64MiB", "--ssd", "none", "--threads", "2", "--data-dir", tempfile.mkdtemp()],
    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
try:
    for line in server.stdout:
        if line.startswith("listening"):
            break
    def rss():
        for l in open(f"/proc/{server.pid}/status"):
            if l.startswith("VmRSS"):
                return int(l.split()[1]) // 1024
    print("RSS at start MiB", rss())
    value = b"v" * 1_200_000
    request = b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$%d\r\n" % len(value) + value + b"\r\n"
    conns, refused = [], 0
    peak = 0
    for i in range(200):
        s = socket.create_connection(("127.0.0.1", port_resp))
        try:
            s.sendall(request[:-10])
        except OSError:
            refused += 1
        conns.append(s)
        if i % 20 == 0:
            peak = max(peak, rss())
    time.sleep(2)
    peak = max(peak, rss())
    alive = 0
    for s in conns:
        s.setblocking(False)
        try:
            alive += 1 if s.recv(1) is None else 0
        except BlockingIOError:
            alive += 1
        except OSError:
            pass
    mc = socket.create_connection(("127.0.0.1", port_mc))
    mc.sendall(b"stats\r\n")
    data = b""
    while not data.endswith(b"END\r\n"):
        data += mc.recv(65536)
    stats = dict(l.split()[1:3] for l in data.decode().splitlines() if l.startswith("STAT"))
    print("peak RSS MiB", peak, "RSS now MiB", rss(), "connections still open", alive, "of 200")
    for k in ["conn_buffer_bytes", "buffer_budget_kicks", "request_size_kicks", "curr_connections"]:
        print(k, stats.get(k))
finally:
    server.terminate(); server.wait()

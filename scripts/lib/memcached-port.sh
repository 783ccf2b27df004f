# Sourced by the bench scripts (after their `cd` to the repository root) that start a
# server on 127.0.0.1 and read it through its memcached port.

# Waits up to $2 seconds for something to listen on 127.0.0.1:$1.
wait_port() {
    for _ in $(seq $(($2 * 10))); do
        ss -ltn | awk '{print $4}' | grep -q "127.0.0.1:$1\$" && return 0
        sleep 0.1
    done
    echo "nothing listens on 127.0.0.1:$1" >&2
    return 1
}

# `stats` of the memcached-protocol server on port $1, as NAME VALUE lines.
stats() {
    python3 - "$1" <<'PY'
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
s.sendall(b"stats\r\n")
buf = b""
while not buf.endswith(b"END\r\n"):
    chunk = s.recv(65536)
    if not chunk:
        break
    buf += chunk
for line in buf.decode().splitlines():
    parts = line.split()
    if len(parts) == 3 and parts[0] == "STAT":
        print(parts[1], parts[2].strip('"'))
PY
}

# The value of stat $2 in the output $1 of `stats`.
stat() { awk -v n="$2" '$1 == n {print $2}' <<<"$1"; }

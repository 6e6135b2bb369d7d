#!/usr/bin/env bash
# Memory of a catch-up: node A holds a g_bloom of ~24 MB (CAPACITY=20000000 at fpr 0.01;
# ITEMS=1000000 added over RESP, enough to make every page of it resident), node B joins over
# NATS and catches up with one full-state transfer; prints A's RSS, B's settled RSS and peak
# (VmHWM), A's peak during the transfer, both nodes' anonymous memory after it, and the bytes
# nats-server carried while B joined (its monitoring port). Needs `scripts/test.sh` run once (.tools/nats) and `cargo build --release`
# (CRPF_BIN: another binary). BENCHMARKS.md, "Catch-up memory".
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${CRPF_BIN:-target/release/crpf}
W="$(mktemp -d)"
trap 'kill ${A:-} ${B:-} ${NATS:-} 2>/dev/null || true; rm -rf "$W"' EXIT
$BIN keygen --out $W/cluster.key 2>/dev/null
.tools/nats/bin/nats-server -js -sd $W/js -a 127.0.0.1 -p 14222 -m 18222 >$W/nats.log 2>&1 & NATS=$!
sleep 1
for n in a b; do
  port=$([ $n = a ] && echo 16391 || echo 16392); mport=$([ $n = a ] && echo 19471 || echo 19472)
  cat > $W/$n.toml <<T
[node]
metrics_addr = "127.0.0.1:$mport"
log = "warn"
auth_key_file = "$W/cluster.key"
[nats]
servers = ["nats://127.0.0.1:14222"]
[resp]
listen = "127.0.0.1:$port"
[catalog]
enabled = false
[[filters]]
name = "big"
filter = { kind = "g_bloom", capacity = ${CAPACITY:-20000000}, fpr = 0.01 }
${FILTER_TOML:-}
T
done
$BIN node --config $W/a.toml 2>$W/a.log & A=$!
sleep 4
ITEMS=${ITEMS:-1000000} python3 - <<'P'
import os, socket
def cmd(*args):
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)
s = socket.create_connection(("127.0.0.1", 16391), timeout=60)
for r in range(int(os.environ["ITEMS"]) // 10000):
    s.sendall(cmd(b"BF.MADD", b"big", *[b"k-%d-%d" % (r, i) for i in range(10000)]))
    buf = b""
    while buf.count(b"\r\n") < 10001:
        buf += s.recv(1 << 20)
P
echo "A: $(grep VmRSS /proc/$A/status)"
sleep 2
nats_bytes() { python3 -c "
import json,urllib.request
v=json.load(urllib.request.urlopen('http://127.0.0.1:18222/varz'))
print(v['in_bytes'], v['out_bytes'])"; }
read IN0 OUT0 < <(nats_bytes)
echo 5 > /proc/$A/clear_refs
$BIN node --config $W/b.toml 2>$W/b.log & B=$!
# How long until B merged a whole state (its metrics), from its start.
python3 - <<'P' &
import time, urllib.request
t0 = time.time()
while time.time() - t0 < 120:
    try:
        m = urllib.request.urlopen("http://127.0.0.1:19472/metrics", timeout=1).read().decode()
        if any(l.startswith("crpf_state_transfers_total") and 'outcome="complete"' in l
               and float(l.rsplit(" ", 1)[1]) >= 1 for l in m.splitlines()):
            print("B merged a whole state %.2f s after its start" % (time.time() - t0))
            break
    except Exception:
        pass
    time.sleep(0.05)
P
for i in $(seq 1 60); do
  sleep 1
  if python3 -c "
import socket,sys
try:
    s=socket.create_connection(('127.0.0.1',16392),timeout=2); s.sendall(b'*3\r\n\$9\r\nBF.EXISTS\r\n\$3\r\nbig\r\n\$7\r\nk-0-123\r\n'); sys.exit(0 if s.recv(100).startswith(b':1') else 1)
except Exception: sys.exit(1)
"; then break; fi
done
echo "B ready after ${i}s"
sleep 10
read IN1 OUT1 < <(nats_bytes)
echo "NATS while B joined: in $(( (IN1-IN0)/1000000 )) MB, out $(( (OUT1-OUT0)/1000000 )) MB"
echo "A peak during the transfer: $(grep VmHWM /proc/$A/status)"
echo "B settled: $(grep VmRSS /proc/$B/status) HWM: $(grep VmHWM /proc/$B/status)"
# RSS counts the binary's mapped code too (~13.5 MiB, file-backed, the same on both nodes);
# anonymous memory is what the node allocated: the state and its own working memory.
echo "Anonymous: A $(grep RssAnon /proc/$A/status | awk '{print $2, $3}'), B $(grep RssAnon /proc/$B/status | awk '{print $2, $3}')"

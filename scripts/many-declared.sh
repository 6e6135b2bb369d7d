#!/usr/bin/env bash
# Issue 52's benchmark: one `crpf node` over a real nats-server (JetStream, monitoring on)
# with N `[[filters]]` entries in its configuration file (g_bloom, capacity CAP, 1%) and the
# default cluster key, then: start until every filter reports ready (its `replica ready` log
# line), idle CPU of both processes, RSS and threads of the node, NATS
# connections, subscriptions, JetStream consumers and API calls, and the messages the
# server took in while idle.
#
#   scripts/many-declared.sh [N]            (default 1000)
#   CRPF_BIN=/tmp/crpf-before scripts/many-declared.sh 1000   (a binary built earlier)
#   CAP=10000 SETTLE=90 scripts/many-declared.sh 10000
#       (SETTLE: idle again SETTLE seconds later, once idle replicas parked)
#   DECLARED_METRICS=own CAP=10000 SETTLE=90 scripts/many-declared.sh 10000
#       (`[catalog] declared_metrics = "own"`: series of their own each, never parked; the
#       default, "node", puts them in the node-wide series, so that idle ones park; a binary
#       from before that setting refuses it)
#
# Needs `scripts/test.sh` to have installed nats-server into .tools/ (or CRPF_NATS_SERVER).
set -euo pipefail
cd "$(dirname "$0")/.."
n="${1:-1000}"
cap="${CAP:-10000}"
nats_server="${CRPF_NATS_SERVER:-$PWD/.tools/nats/bin/nats-server}"
[ -x "$nats_server" ] || { echo "no nats-server: run scripts/test.sh first" >&2; exit 1; }
# CRPF_BIN: a binary built earlier (a before-and-after comparison), else this checkout's.
bin="${CRPF_BIN:-target/release/crpf}"
[ -n "${CRPF_BIN:-}" ] || cargo build --release --quiet --bin crpf
work="$(mktemp -d)"
port=$((20000 + RANDOM % 20000)); monitor=$((port + 1)); metrics=$((port + 2))
cleanup() { kill "${node_pid:-}" "${nats_pid:-}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT

"$nats_server" -js -sd "$work/js" -a 127.0.0.1 -p "$port" -m "$monitor" >"$work/nats.log" 2>&1 &
nats_pid=$!
"$bin" keygen --out "$work/cluster.key" 2>/dev/null
{
  echo "[node]"
  echo "auth_key_file = \"$work/cluster.key\""
  echo "metrics_addr = \"127.0.0.1:$metrics\""
  echo "log = \"warn,crpf::replica::actor=info\""
  echo "[nats]"
  echo "servers = [\"nats://127.0.0.1:$port\"]"
  echo "retry_on_initial_connect = true"
  if [ -n "${DECLARED_METRICS:-}" ]; then
    echo "[catalog]"
    echo "declared_metrics = \"$DECLARED_METRICS\""
  fi
  for i in $(seq 1 "$n"); do
    echo "[[filters]]"
    echo "name = \"d$i\""
    echo "filter = { kind = \"g_bloom\", capacity = $cap, fpr = 0.01 }"
  done
} >"$work/node.toml"

ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
varz() { curl -s "http://127.0.0.1:$monitor/varz" | grep -o "\"$1\": [0-9]*" | grep -o '[0-9]*$'; }
jsapi() { curl -s "http://127.0.0.1:$monitor/jsz" | grep -o '"total": [0-9]*' | head -1 | grep -o '[0-9]*$'; }
# From the log, not from `crpf_ready`: a scrape of 10,000 filters' series every 0.2 s took
# most of the node's CPU as it started.
ready() { grep -c "replica ready" "$work/node.log" || true; }

sleep 0.5
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
started=$(date +%s.%N)
"$bin" node --config "$work/node.toml" >>"$work/node.log" 2>&1 &
node_pid=$!
until [ "$(ready)" -ge "$n" ]; do
  kill -0 "$node_pid" 2>/dev/null || { echo "the node exited:" >&2; tail -20 "$work/node.log" >&2; exit 1; }
  sleep 0.2
done
echo "start of $n declared filters until all ready: $(echo "$(date +%s.%N) - $started" | bc) s"

measure() {
  local a b c d m0 m1 j0 j1 hz secs=20
  hz=$(getconf CLK_TCK)
  a=$(ticks "$node_pid"); b=$(ticks "$nats_pid"); m0=$(varz in_msgs); j0=$(jsapi)
  sleep "$secs"
  c=$(ticks "$node_pid"); d=$(ticks "$nats_pid"); m1=$(varz in_msgs); j1=$(jsapi)
  awk -v n=$((c - a)) -v s=$((d - b)) -v hz="$hz" -v t="$secs" \
    'BEGIN { printf "idle CPU over %d s: node %.1f%% of a core, nats-server %.1f%%\n", t, n * 100 / hz / t, s * 100 / hz / t }'
  echo "messages into nats-server while idle: $(( (m1 - m0) / secs ))/s, of which JetStream API requests: $(( (j1 - j0) / secs ))/s"
  echo "node RSS: $(( $(awk '/VmRSS/ {print $2}' "/proc/$node_pid/status") / 1024 )) MiB, threads: $(awk '/Threads/ {print $2}' "/proc/$node_pid/status")"
  echo "parked filters: $(curl -s "http://127.0.0.1:$metrics/metrics" | awk '/^crpf_parked_filters / {print $2}')"
  echo "NATS connections: $(varz connections), subscriptions: $(varz subscriptions), JetStream consumers: $(curl -s "http://127.0.0.1:$monitor/jsz" | grep -o '"consumers": [0-9]*' | head -1 | grep -o '[0-9]*$'), JetStream API requests so far: $(jsapi)"
}
measure
if [ "${SETTLE:-0}" -gt 0 ]; then
  sleep "$SETTLE"
  echo "after $SETTLE s more:"
  measure
fi

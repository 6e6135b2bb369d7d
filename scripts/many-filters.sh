#!/usr/bin/env bash
# Issue 23's benchmark: one `crpf node` over a real nats-server (JetStream, monitoring on),
# N g_bloom filters (capacity 1,000, 1%) created through the catalog API, then the figures
# BENCHMARKS.md records: create rate, node start from its data directory, idle CPU of both
# processes over 10 s, RSS and threads of the node, NATS connections, subscriptions and
# JetStream consumers.
#
#   scripts/many-filters.sh [N] [--data]     (default 1000; --data: with a data directory)
#   CAP=10000 NO_RESTART=1 scripts/many-filters.sh 10000   (capacity 10,000; no restart)
#   SETTLE=90 scripts/many-filters.sh ...      (and idle again 90 s after the creates' and the
#                                               restart's figures, once idle replicas parked)
#
# Needs `scripts/test.sh` to have installed nats-server into .tools/ (or CRPF_NATS_SERVER).
set -euo pipefail
cd "$(dirname "$0")/.."
n="${1:-1000}"
with_data="${2:-}"
nats_server="${CRPF_NATS_SERVER:-$PWD/.tools/nats/bin/nats-server}"
[ -x "$nats_server" ] || { echo "no nats-server: run scripts/test.sh first" >&2; exit 1; }
cargo build --release --quiet --bin crpf --example many_filters
work="$(mktemp -d)"
port=$((20000 + RANDOM % 20000)); monitor=$((port + 1)); metrics=$((port + 2))
cleanup() { kill "${node_pid:-}" "${nats_pid:-}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT

"$nats_server" -js -sd "$work/js" -a 127.0.0.1 -p "$port" -m "$monitor" >"$work/nats.log" 2>&1 &
nats_pid=$!
target/release/crpf keygen --out "$work/cluster.key" 2>/dev/null
{
  echo "[node]"
  echo "auth_key_file = \"$work/cluster.key\""
  echo "metrics_addr = \"127.0.0.1:$metrics\""
  echo "log = \"warn\""
  [ "$with_data" = "--data" ] && echo "data_dir = \"$work/data\""
  echo "[nats]"
  echo "servers = [\"nats://127.0.0.1:$port\"]"
  echo "retry_on_initial_connect = true"
  echo "[catalog]"
} >"$work/node.toml"
start_node() {
  target/release/crpf node --config "$work/node.toml" >>"$work/node.log" 2>&1 &
  node_pid=$!
}
wait_api() {
  target/release/examples/many_filters --nats "nats://127.0.0.1:$port" --wait-api
}
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

sleep 0.5
start_node
wait_api
target/release/examples/many_filters --nats "nats://127.0.0.1:$port" --count "$n" --capacity "${CAP:-1000}"

measure() {
  sleep 5
  local a b c d hz
  hz=$(getconf CLK_TCK)
  a=$(ticks "$node_pid"); b=$(ticks "$nats_pid")
  sleep 10
  c=$(ticks "$node_pid"); d=$(ticks "$nats_pid")
  awk -v n=$((c - a)) -v s=$((d - b)) -v hz="$hz" \
    'BEGIN { printf "idle CPU over 10 s: node %.1f%% of a core, nats-server %.1f%%\n", n * 100 / hz / 10, s * 100 / hz / 10 }'
  echo "node RSS: $(( $(awk '/VmRSS/ {print $2}' "/proc/$node_pid/status") / 1024 )) MiB, threads: $(awk '/Threads/ {print $2}' "/proc/$node_pid/status")"
  echo "NATS connections: $(curl -s "http://127.0.0.1:$monitor/connz" | grep -o '"num_connections": [0-9]*' | grep -o '[0-9]*$'), subscriptions: $(curl -s "http://127.0.0.1:$monitor/varz" | grep -o '"subscriptions": [0-9]*' | grep -o '[0-9]*$'), JetStream consumers: $(curl -s "http://127.0.0.1:$monitor/jsz" | grep -o '"consumers": [0-9]*' | head -1 | grep -o '[0-9]*$')"
}
measure
# Idle replicas park after `catalog.park_after_ms` (60 s): idle again SETTLE seconds later.
if [ "${SETTLE:-0}" -gt 0 ]; then
  sleep "$SETTLE"
  echo "after $SETTLE s more:"
  measure
fi

[ -z "${NO_RESTART:-}" ] || exit 0
# A restart: the node hosts every filter of the catalog again (from its data directory, with
# --data) before it serves the catalog API.
kill "$node_pid"; wait "$node_pid" 2>/dev/null || true
started=$(date +%s.%N)
start_node
wait_api
echo "node start with $n filters: $(echo "$(date +%s.%N) - $started" | bc) s"
measure
# Idle once a lone node's replicas have spaced their digests out (nobody hears them; up to
# six anti-entropy intervals apart after three at the interval) and parked: SETTLE seconds
# later.
if [ "${SETTLE:-0}" -gt 0 ]; then
  sleep "$SETTLE"
  echo "after $SETTLE s more:"
  measure
fi

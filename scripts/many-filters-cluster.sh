#!/usr/bin/env bash
# Issue 23's three-node benchmark: the stack of scripts/stack.sh (three nats-servers in a
# JetStream cluster, three `crpf node` processes following the catalog, each behind its own
# server), N g_bloom filters (capacity 1,000, 1%) created through node 1's server, then:
#   - how long a filter created through server 1 takes until the nodes behind servers 2 and 3
#     both answer `contains` on their own replica subjects, and how long a drop takes until
#     neither answers any more (S samples, one at a time); then the same on the request API's
#     subject through server 2 (whichever node takes it);
#   - idle CPU of the three nodes and the three servers over 10 s, the nodes' RSS and parked
#     filters (catalog.park_after_ms is 60 s by default: SETTLE=90 to see them parked), and
#     the load average.
#   CRPF_BIN=/path/to/crpf runs another binary (a before/after comparison).
#
#   scripts/many-filters-cluster.sh [N] [S]      (defaults 1000 filters, 200 samples)
#   SETTLE=60 scripts/many-filters-cluster.sh ...  (and idle again 60 s after the first window)
#
# Ports of scripts/stack.sh (4222-4224, 6222-6224, 9465-9467, 9090): nothing else may hold them.
set -euo pipefail
cd "$(dirname "$0")/.."
n="${1:-1000}"
samples="${2:-200}"
cargo build --release --quiet --bin crpf --example many_filters
export CRPF_STACK_DIR
CRPF_STACK_DIR="$(mktemp -d)"
export CRPF_BIN="${CRPF_BIN:-$PWD/target/release/crpf}"
cleanup() { scripts/stack.sh stop >/dev/null 2>&1 || true; rm -rf "$CRPF_STACK_DIR"; }
trap cleanup EXIT
scripts/stack.sh start >/dev/null
mf=target/release/examples/many_filters
$mf --nats nats://127.0.0.1:4222 --wait-api
# Each node logs the id its catalog filters share.
far=""
for i in 2 3; do
  id=""
  for _ in $(seq 1 100); do
    id="$(grep -o 'claimed the node.s replica id.*' "$CRPF_STACK_DIR/logs/node$i.log" | grep -o 'replica=[0-9]*' | head -1 | cut -d= -f2 || true)"
    [ -n "$id" ] && break
    sleep 0.1
  done
  [ -n "$id" ] || { echo "node$i logged no node id" >&2; exit 1; }
  far="${far:+$far,}$id"
done
echo "far replicas (nodes 2 and 3): $far"
$mf --nats nats://127.0.0.1:4222,nats://127.0.0.1:4223 --count "$n" \
  --visibility-samples "$samples" --far-replicas "$far"
# The same through the request API's own subject (`crpf.<f>.api.contains`, the nodes' queue
# group): answered by whichever node the server hands it to, refused by all after a drop.
$mf --nats nats://127.0.0.1:4222,nats://127.0.0.1:4223 --count 0 --prefix queue- \
  --visibility-samples "$samples"

pid() { cat "$CRPF_STACK_DIR/pids/$1.pid"; }
ticks() { awk '{print $14 + $15}' "/proc/$(pid "$1")/stat"; }
idle() {
  local p hz
  declare -A before
  local names=(node1 node2 node3 nats1 nats2 nats3)
  for p in "${names[@]}"; do before[$p]=$(ticks "$p"); done
  sleep 10
  hz=$(getconf CLK_TCK)
  for p in "${names[@]}"; do
    awk -v t=$(( $(ticks "$p") - before[$p] )) -v hz="$hz" -v p="$p" \
      'BEGIN { printf "idle CPU over 10 s, %s: %.1f%% of a core\n", p, t * 100 / hz / 10 }'
  done
}
sleep 5
idle
# New filters' first snapshots (with the stack's data directories) are still being written
# in the first window: SETTLE seconds later, idle again.
if [ "${SETTLE:-0}" -gt 0 ]; then
  sleep "$SETTLE"
  echo "after $SETTLE s more:"
  idle
fi
for i in 1 2 3; do
  echo "node$i RSS: $(( $(awk '/VmRSS/ {print $2}' "/proc/$(pid "node$i")/status") / 1024 )) MiB"
  # Replicas parked (no actor running) of the node's filters, from its exporter.
  echo "node$i parked filters: $(curl -s "http://127.0.0.1:946$((i + 4))/metrics" \
    | awk '$1 == "crpf_parked_filters" {print $2}')"
done
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"

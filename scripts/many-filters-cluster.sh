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
#   RESTART=1 (RESTARTS=K: K times): then, once every node parked all N filters (up to 5 minutes), node 3 stops
#     (SIGTERM) and starts again: the seconds until every filter answers `contains` on node
#     3's own replica subjects (probed through its server, 64 at once, from its spawn), its
#     CPU seconds by then and 30 s later, its RSS, and how many replicas woke on the peers
#     (nodes 1 and 2: `crpf_parking_total{change="resumed"}`), pushed or merged a whole
#     state, and (this build) were restored parked and confirmed by a peer's digest.
#
#   RESTART_BINS="a b": the restarts run these binaries in turn (round 1 a, round 2 b, round 3
#     a, ...): a before/after comparison of restarts on the same data.
#   KEEP=1: once done, the stack stays up until $CRPF_STACK_DIR/release exists (it prints the
#     directory), for restarts and profiles by hand.
#   PARALLEL=1: the N creates are made by three creators at once, each through its own server
#     (a third of the names each): each one's rate and the cluster-wide rate (N / wall time).
#   Also: each node's data directory in bytes per filter, and each nats-server's subscriptions
#     and messages in and out per second at rest (from its monitoring port).
#
#   scripts/many-filters-cluster.sh [N] [S]      (defaults 1000 filters, 200 samples)
#   SETTLE=60 scripts/many-filters-cluster.sh ...  (and idle again 60 s after the first window)
#
# Ports of scripts/stack.sh (4222-4224, 6222-6224, 8222-8224, 9465-9467, 9090), each moved by
# CRPF_STACK_PORT_OFFSET if set: nothing else may hold them.
set -euo pipefail
cd "$(dirname "$0")/.."
n="${1:-1000}"
samples="${2:-200}"
cargo build --release --quiet --bin crpf --example many_filters
# Room for the N filters and the samples' (a node refuses creates past catalog.max_filters,
# 100,000 by default).
export CRPF_CATALOG__MAX_FILTERS="${CRPF_CATALOG__MAX_FILTERS:-$((n + 1000))}"
export CRPF_STACK_DIR
CRPF_STACK_DIR="$(mktemp -d)"
export CRPF_BIN="${CRPF_BIN:-$PWD/target/release/crpf}"
cleanup() { scripts/stack.sh stop >/dev/null 2>&1 || true; rm -rf "$CRPF_STACK_DIR"; }
trap cleanup EXIT
off="${CRPF_STACK_PORT_OFFSET:-0}"
url() { echo "nats://127.0.0.1:$((off + 4221 + $1))"; }
mport() { echo "$((off + 9464 + $1))"; }
echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
scripts/stack.sh start >/dev/null
mf=target/release/examples/many_filters
$mf --nats "$(url 1)" --wait-api
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
if [ "${PARALLEL:-0}" = 1 ]; then
  t0=$(date +%s.%N)
  cpids=()
  for i in 1 2 3; do
    from=$(( (i - 1) * n / 3 ))
    $mf --nats "$(url "$i")" --count $(( i * n / 3 - from )) --first "$from" | sed "s/^/through server $i: /" &
    cpids+=($!)
  done
  for p in "${cpids[@]}"; do wait "$p"; done
  awk -v a="$t0" -v b="$(date +%s.%N)" -v n="$n" \
    'BEGIN { printf "create, three creators at once: %d filters in %.2f s = %.0f filters/s\n", n, b - a, n / (b - a) }'
  $mf --nats "$(url 1),$(url 2)" --count 0 --visibility-samples "$samples" --far-replicas "$far"
else
  $mf --nats "$(url 1),$(url 2)" --count "$n" \
    --visibility-samples "$samples" --far-replicas "$far"
fi
# The same through the request API's own subject (`crpf.<f>.api.contains`, the nodes' queue
# group): answered by whichever node the server hands it to, refused by all after a drop.
$mf --nats "$(url 1),$(url 2)" --count 0 --prefix queue- \
  --visibility-samples "$samples"

pid() { cat "$CRPF_STACK_DIR/pids/$1.pid"; }
ticks() { awk '{print $14 + $15}' "/proc/$(pid "$1")/stat"; }
idle() {
  local p hz
  declare -A before
  local names=(node1 node2 node3 nats1 nats2 nats3)
  declare -A msgs
  for p in "${names[@]}"; do before[$p]=$(ticks "$p"); done
  for i in 1 2 3; do msgs[$i]="$(varz "$i" in_msgs),$(varz "$i" out_msgs)"; done
  sleep 10
  hz=$(getconf CLK_TCK)
  for p in "${names[@]}"; do
    awk -v t=$(( $(ticks "$p") - before[$p] )) -v hz="$hz" -v p="$p" \
      'BEGIN { printf "idle CPU over 10 s, %s: %.1f%% of a core\n", p, t * 100 / hz / 10 }'
  done
  for i in 1 2 3; do
    # Messages in and out per second over the 10 s, and subscriptions, from the monitoring port.
    awk -v i="$i" -v a="${msgs[$i]}" -v b="$(varz "$i" in_msgs),$(varz "$i" out_msgs)" 'BEGIN {
      split(a, x, ","); split(b, y, ",");
      printf "nats%d at rest: %.1f msgs/s in, %.1f msgs/s out\n", i, (y[1] - x[1]) / 10, (y[2] - x[2]) / 10 }'
    echo "nats$i subscriptions: $(varz "$i" subscriptions)"
  done
}
# Field $2 of nats-server $1's /varz.
varz() {
  curl -s "http://127.0.0.1:$((off + 8221 + $1))/varz" | tr -d ' ,' | awk -F: -v k="\"$2\"" '$1 == k {print $2; exit}'
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
  echo "node$i parked filters: $(curl -s "http://127.0.0.1:$(mport "$i")/metrics" \
    | awk '$1 == "crpf_parked_filters" {print $2}')"
  # The node's data directory (snapshots, logs, catalog state) per filter it hosts.
  du -sb "$CRPF_STACK_DIR/data/node$i" | awk -v n="$n" -v i="$i" \
    '{ printf "node%d data directory: %.1f MiB, %.0f bytes per filter\n", i, $1 / 1048576, $1 / n }'
done
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"

[ "${RESTART:-0}" = 1 ] || exit 0
# The sum of node $1's (1-3) series named $2 whose labels hold $3 (any, if none).
metric() {
  curl -s "http://127.0.0.1:$(mport "$1")/metrics" \
    | awk -v s="$2" -v l="${3:-}" '($1 == s || index($1, s "{") == 1) && index($1, l) {t += $NF}
        END {printf "%d", t}'
}
echo "restart of node3: waiting until every node parked its $n filters"
waited=0
until [ "$(metric 1 crpf_parked_filters)" -ge "$n" ] && [ "$(metric 2 crpf_parked_filters)" -ge "$n" ] \
  && [ "$(metric 3 crpf_parked_filters)" -ge "$n" ]; do
  sleep 5
  waited=$((waited + 5))
  [ "$waited" -lt 300 ] || { echo "not all parked after 300 s"; break; }
done
echo "all parked after $waited s more; load average: $(cut -d' ' -f1-3 /proc/loadavg)"
peers() {
  local i
  for i in 1 2; do
    echo "node$i resumed=$(metric $i crpf_parking_total 'change="resumed"') pushes=$(metric $i crpf_state_pushes_total) state_merges=$(metric $i crpf_merges_total 'source="state"')"
  done
}
# RESTARTS=K: node 3 restarts K times in a row (each once every filter parked again).
read -r -a restart_bins <<<"${RESTART_BINS:-$CRPF_BIN}"
for round in $(seq 1 "${RESTARTS:-1}"); do
  bin="${restart_bins[$(((round - 1) % ${#restart_bins[@]}))]}"
  [ "$round" = 1 ] || {
    echo "restart $round: waiting until node3 parked its $n filters again"
    waited=0
    until [ "$(metric 3 crpf_parked_filters)" -ge "$n" ]; do
      sleep 5
      waited=$((waited + 5))
      [ "$waited" -lt 300 ] || { echo "not all parked after 300 s"; break; }
    done
    echo "parked after $waited s; load average: $(cut -d' ' -f1-3 /proc/loadavg)"
  }
  echo "peers before: $(peers | tr '\n' ' ')"
  kill -TERM "$(pid node3)"
  while kill -0 "$(pid node3)" 2>/dev/null; do sleep 0.1; done
  logs_before=$(grep -c "claimed the node.s replica id" "$CRPF_STACK_DIR/logs/node3.log" || true)
  lines_before=$(wc -l <"$CRPF_STACK_DIR/logs/node3.log")
  start=$(date +%s.%N)
  CRPF_NODE__DATA_DIR="$CRPF_STACK_DIR/data/node3" CRPF_NODE__AUTH_KEY_FILE="$CRPF_STACK_DIR/cluster.key" \
    "$bin" node --config "$(scripts/stack.sh config 3)" >>"$CRPF_STACK_DIR/logs/node3.log" 2>&1 &
  echo $! >"$CRPF_STACK_DIR/pids/node3.pid"
  id3=""
  for _ in $(seq 1 600); do
    if [ "$(grep -c "claimed the node.s replica id" "$CRPF_STACK_DIR/logs/node3.log" || true)" -gt "$logs_before" ]; then
      id3="$(grep -o 'claimed the node.s replica id.*' "$CRPF_STACK_DIR/logs/node3.log" | tail -1 | grep -o 'replica=[0-9]*' | cut -d= -f2)"
      break
    fi
    sleep 0.05
  done
  [ -n "$id3" ] || { echo "node3 logged no node id after its restart" >&2; exit 1; }
  $mf --nats "$(url 3)" --probe "$n" --far-replicas "$id3"
  hz=$(getconf CLK_TCK)
  elapsed() { awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }
  cpu() { awk -v hz="$hz" '{ printf "%.1f", ($14 + $15) / hz }' "/proc/$(pid node3)/stat"; }
  echo "node3 restarted ($bin): every filter answered on its own subjects $(elapsed) s after its start, $(cpu) s of CPU by then"
  # When its start had hosted every filter of the catalog (the probes wait for that too).
  followed="$(tail -n +"$((lines_before + 1))" "$CRPF_STACK_DIR/logs/node3.log" | grep -m1 'filter catalog followed' | cut -d' ' -f1 || true)"
  [ -z "$followed" ] || awk -v a="$start" -v b="$(date -d "$followed" +%s.%N)" \
    'BEGIN { printf "node3 logged the catalog followed (every filter hosted) %.1f s after its start\n", b - a }'
  sleep 30
  echo "30 s later: node3 $(cpu) s of CPU, RSS $(( $(awk '/VmRSS/ {print $2}' "/proc/$(pid node3)/status") / 1024 )) MiB"
  echo "node3 restored=$(metric 3 crpf_parking_total 'change="restored"') confirmed=$(metric 3 crpf_parking_total 'change="confirmed"') resumed=$(metric 3 crpf_parking_total 'change="resumed"') pushes=$(metric 3 crpf_state_pushes_total) state_merges=$(metric 3 crpf_merges_total 'source="state"') parked=$(metric 3 crpf_parked_filters)"
  echo "node3 log since its restart: $(tail -n +"$((lines_before + 1))" "$CRPF_STACK_DIR/logs/node3.log" | grep -c 'alone' || true) replicas ready 'alone'"
  echo "peers after: $(peers | tr '\n' ' ')"
  echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
done
if [ "${KEEP:-0}" = 1 ]; then
  echo "kept: CRPF_STACK_DIR=$CRPF_STACK_DIR (touch $CRPF_STACK_DIR/release to stop it)"
  until [ -e "$CRPF_STACK_DIR/release" ]; do sleep 2; done
fi

#!/usr/bin/env bash
# Instructions a server executes per request under redis-benchmark (-c 16 -P 16), counted by
# valgrind's callgrind: a figure that load on the machine does not move (CPU time per request
# does, by a factor on a busy 2-core machine). Counts user-space instructions of the server
# process (libraries included, the kernel's socket work not).
#
#   CRPF_BIN=target/release/crpf scripts/resp-instructions.sh [COMMAND...]
#   SERVER=redis scripts/resp-instructions.sh BF.ADD      # redis-server with RedisBloom
#
# COMMANDs: BF.ADD BF.EXISTS CF.ADD CF.EXISTS CMS.INCRBY CMS.QUERY TOPK.ADD TOPK.QUERY (default:
# the first four; TOPK.* on a top-k of 50 over 2000 x 5, decay 0.9, as RedisBloom's bench key).
# N requests are counted (default 40,000) after 2,000 of warm-up, items random as
# scripts/resp-vs-redisbloom.sh makes them (-r 100000000). Needs valgrind and the bench
# tools (scripts/install-bench-tools.sh). Prints: server command instructions/request.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
redis="$root/.tools/redis"
export LD_LIBRARY_PATH="$redis/root/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
bench="$redis/root/usr/bin/redis-benchmark"
cli="$redis/root/usr/bin/redis-cli"
crpf="${CRPF_BIN:-$root/target/release/crpf}"
SERVER="${SERVER:-crpf}"
N="${N:-40000}"
[ $# -gt 0 ] || set -- BF.ADD BF.EXISTS CF.ADD CF.EXISTS
command -v valgrind >/dev/null || { echo "valgrind is missing (apt-get install valgrind)" >&2; exit 1; }
work="$(mktemp -d)"
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
# The instructions of a server's whole life that served 2,000 warm-up requests and then n.
# redis-server renames its process, which callgrind_control cannot find: its figure is the
# difference of two lives, n and 0 (crpf's the same way, for one method).
life() {
  local cmd=$1 n=$2 port out pid key
  port="$(free_port)"
  out="$work/cg.out"
  rm -f "$out"*
  if [ "$SERVER" = redis ]; then
    valgrind --tool=callgrind --callgrind-out-file="$out" \
      "$redis/root/usr/bin/redis-server" --port "$port" --save '' --appendonly no \
      --loadmodule "$redis/redisbloom.so" >"$work/server.log" 2>&1 &
  else
    cat >"$work/node.toml" <<TOML
[node]
metrics_addr = "127.0.0.1:$(free_port)"
[resp]
listen = "127.0.0.1:$port"
[[filters]]
name = "bloom"
filter = { kind = "g_bloom", capacity = 30_000_000, fpr = 0.01 }
[[filters]]
name = "cuckoo"
filter = { kind = "g_cuckoo", capacity = 30_000_000, fpr = 0.01 }
TOML
    valgrind --tool=callgrind --callgrind-out-file="$out" \
      "$crpf" node --config "$work/node.toml" >"$work/server.log" 2>&1 &
  fi
  pid=$!
  for _ in $(seq 600); do "$cli" -p "$port" PING 2>/dev/null | grep -q PONG && break; sleep 0.2; done
  if [ "$SERVER" = redis ]; then
    "$cli" -p "$port" BF.RESERVE bloom 0.01 30000000 >/dev/null
    "$cli" -p "$port" CF.RESERVE cuckoo 30000000 >/dev/null
  else
    for _ in $(seq 600); do "$cli" -p "$port" BF.EXISTS bloom x 2>/dev/null | grep -q '^0$' && break; sleep 0.2; done
  fi
  "$cli" -p "$port" CMS.INITBYDIM sketch 2000 5 >/dev/null
  "$cli" -p "$port" TOPK.RESERVE heavy 50 2000 5 0.9 >/dev/null
  case $cmd in BF.*) key=bloom ;; CF.*) key=cuckoo ;; CMS.*) key=sketch ;; TOPK.*) key=heavy ;; *) echo "unknown $cmd" >&2; exit 1 ;; esac
  local extra=()
  [ "$cmd" = CMS.INCRBY ] && extra=(1)
  "$bench" -p "$port" -c 16 -P 16 -n 2000 -r 100000000 -q "$cmd" "$key" __rand_int__ "${extra[@]}" >/dev/null 2>&1
  if [ "$n" -gt 0 ]; then
    "$bench" -p "$port" -c 16 -P 16 -n "$n" -r 100000000 -q "$cmd" "$key" __rand_int__ "${extra[@]}" >/dev/null 2>&1
  fi
  kill -INT "$pid"; wait "$pid" 2>/dev/null || true
  local total=0 t f
  for f in "$out"*; do
    t="$(callgrind_annotate "$f" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1; exit}')"
    if [[ "$t" =~ ^[0-9]+$ ]]; then total=$((total + t)); fi
  done
  echo "$total"
}
for cmd in "$@"; do
  with="$(life "$cmd" "$N")"
  without="$(life "$cmd" 0)"
  [ -n "${VERBOSE:-}" ] && echo "lives: $with $without" >&2
  echo "$SERVER $cmd $(((with - without) / N))"
done

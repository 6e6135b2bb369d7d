#!/usr/bin/env bash
# Installs Go with the bits-and-blooms/bloom library into .tools/go (project-local, nothing
# global), for tests/go_interop.rs, which builds tests/go/bloomtool.go offline:
#   .tools/go/bin/go     Debian's golang-1.19 (compiler and standard library) and the packages
#                        golang-github-willf-bloom-dev (bits-and-blooms/bloom 3.3.1) and
#                        golang-github-bits-and-blooms-bitset-dev, unpacked under .tools/go/root;
#                        a wrapper points GOROOT and GOPATH there (GOPATH mode, GO111MODULE=off:
#                        no module download) and GOCACHE at .tools/go/cache.
# Safe to re-run; installs only what is missing. Nothing is installed where CRPF_GO names a
# `go` already set up that way. Needs apt-get and dpkg-deb (Debian, Ubuntu), no root once the
# package lists exist.
#   scripts/install-go.sh           install what is missing, then print the path
#   scripts/install-go.sh --check   install nothing: print what the install would need and is
#                                   missing, one line each (exit status 1 if any)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -d .tools ]; then tools="$(cd .tools && pwd -P)"; else tools="$PWD/.tools"; fi
go_dir="$tools/go"

need=false
if [ -z "${CRPF_GO:-}" ] && [ ! -x "$go_dir/bin/go" ]; then need=true; fi
missing=()
if $need; then
  for t in apt-get dpkg-deb; do
    command -v "$t" >/dev/null ||
      missing+=("$t: Go and bits-and-blooms/bloom are taken from Debian's packages (elsewhere, set CRPF_GO to a go command that builds with GO111MODULE=off and a GOPATH holding github.com/bits-and-blooms/bloom and bitset)")
  done
fi
if [ "${1:-}" = "--check" ]; then
  [ "${#missing[@]}" -eq 0 ] || { printf '%s\n' "${missing[@]}"; exit 1; }
  exit 0
fi
if [ "${#missing[@]}" -gt 0 ]; then
  echo "scripts/install-go.sh cannot install Go; missing:" >&2
  printf '  - %s\n' "${missing[@]}" >&2
  exit 1
fi

if $need; then
  echo "installing go and bits-and-blooms/bloom (Debian packages, unpacked) into $go_dir" >&2
  deb_dir="$(mktemp -d)"
  trap 'rm -rf "$deb_dir"' EXIT
  pkgs=(golang-1.19-go golang-1.19-src golang-github-willf-bloom-dev golang-github-bits-and-blooms-bitset-dev)
  # apt-get download writes into the current directory; the _apt user cannot, hence the chmod.
  chmod 777 "$deb_dir"
  if ! (cd "$deb_dir" && apt-get download "${pkgs[@]}" >/dev/null 2>&1); then
    # No package lists yet (a fresh container): fetching them needs root.
    if ! apt-get update >/dev/null || ! (cd "$deb_dir" && apt-get download "${pkgs[@]}" >/dev/null); then
      echo "could not download Debian's packages ${pkgs[*]} (apt-get update needs root);" \
        "run 'sudo apt-get update' once, or set CRPF_GO" >&2
      exit 1
    fi
  fi
  rm -rf "$go_dir/root"
  mkdir -p "$go_dir/root" "$go_dir/bin" "$go_dir/cache"
  for deb in "$deb_dir"/*.deb; do
    dpkg-deb -x "$deb" "$go_dir/root"
  done
  goroot="$(find "$go_dir/root/usr/lib" -maxdepth 1 -name 'go-*' | head -n 1)"
  cat >"$go_dir/bin/go" <<WRAPPER
#!/bin/sh
# Debian's go, unpacked under .tools/go/root, building offline against the packaged libraries.
GOROOT="$goroot" GOPATH="$go_dir/root/usr/share/gocode" GO111MODULE=off \\
  GOCACHE="$go_dir/cache" GOFLAGS= GOTOOLCHAIN=local exec "$goroot/bin/go" "\$@"
WRAPPER
  chmod 755 "$go_dir/bin/go"
  rm -rf "$deb_dir"
  trap - EXIT
fi

go="${CRPF_GO:-$go_dir/bin/go}"
if ! "$go" version >/dev/null; then
  echo "$go does not run: remove $go_dir to install it again" >&2
  exit 1
fi
if $need || [ -t 1 ]; then
  echo "go: $go ($("$go" version | cut -d' ' -f3))"
fi

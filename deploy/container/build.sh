#!/usr/bin/env bash
# Builds the image deploy/kubernetes names (dquant:VERSION, from the workspace's version) with
# podman, from this machine alone, and checks that it holds a working dquant: the image's file
# system is exported and `dquant --version` and `dquant serve --help` run from it (chroot), so
# the check needs no container runtime, only the image.
#
# Usage:
#   deploy/container/build.sh            # build target/release/dquant if missing, then the image
#   DQUANT_BIN=path deploy/container/build.sh   # package that binary instead
#   deploy/container/build.sh --check-only      # only check an image already built
#
# Needs root (chroot) and podman (Debian: apt-get install podman). Prints the image's id and
# size at the end.
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$repo"
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
image="dquant:$version"
grep -q "image: $image" deploy/kubernetes/storage.yaml ||
  { echo "deploy/kubernetes names another image than $image: keep them in step" >&2; exit 1; }
command -v podman >/dev/null || { echo "podman is missing: apt-get install podman" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

if [ "${1:-}" != --check-only ]; then
  bin=${DQUANT_BIN:-target/release/dquant}
  if [ ! -x "$bin" ]; then
    echo "== cargo build --release -p dquant-cli"
    cargo build --release --locked -q -p dquant-cli
  fi
  rootfs="$work/rootfs"
  install -D -m 0755 "$bin" "$rootfs/usr/local/bin/dquant"
  # Line tables stay in target/ for backtraces there; the image carries the code alone.
  strip --strip-debug "$rootfs/usr/local/bin/dquant"
  # Exactly the libraries the binary links, at the paths the loader looks for them.
  ldd "$bin" | awk '/=> \// { print $3 } /^[ \t]*\/[^ ]*ld-linux/ { print $1 }' | sort -u |
    while read -r lib; do
      install -D -m 0755 "$(readlink -f "$lib")" "$rootfs$lib"
    done
  if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
    install -D -m 0644 /etc/ssl/certs/ca-certificates.crt "$rootfs/etc/ssl/certs/ca-certificates.crt"
  fi
  mkdir -p "$rootfs/etc" "$rootfs/tmp" "$rootfs/home/dquant" "$rootfs/run/dquant"
  chmod 1777 "$rootfs/tmp"
  chown 65532:65532 "$rootfs/home/dquant" "$rootfs/run/dquant"
  printf 'root:x:0:0:root:/root:/sbin/nologin\ndquant:x:65532:65532:dquant:/home/dquant:/sbin/nologin\n' >"$rootfs/etc/passwd"
  printf 'root:x:0:\ndquant:x:65532:\n' >"$rootfs/etc/group"
  cp deploy/container/Containerfile "$work/Containerfile"
  echo "== podman build -t $image"
  podman build --quiet --network=none -f "$work/Containerfile" -t "$image" "$work"
fi

# The check: the image's own files, exported, run the binary (no container is started).
echo "== checking $image: dquant --version and dquant serve --help from its file system"
ctr=$(podman create "$image")
mkdir "$work/export"
podman export "$ctr" | tar -x -C "$work/export"
podman rm -f "$ctr" >/dev/null
got=$(chroot --userspec=65532:65532 "$work/export" /usr/local/bin/dquant --version)
want="dquant $version"
[ "$got" = "$want" ] || { echo "the image's dquant says '$got', not '$want'" >&2; exit 1; }
chroot --userspec=65532:65532 "$work/export" /usr/local/bin/dquant serve --help | grep -q -- '--config' ||
  { echo "the image's dquant serve --help does not describe --config" >&2; exit 1; }
size=$(podman image inspect "$image" --format '{{.Size}}')
echo "image $image ($(podman image inspect "$image" --format '{{.Id}}' | cut -c1-12)): $((size / 1048576)) MiB; $got runs from it"

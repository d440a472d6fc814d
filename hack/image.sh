#!/usr/bin/env bash
# Builds the podgroup-sync container image with no registry and no container engine: the release
# binary linked statically (glibc's static libc, `-C target-feature=+crt-static`) on an empty
# base, assembled into an OCI image archive by umoci (Debian package `umoci`, installed with
# apt-get when missing). The layout is the Dockerfile's: /usr/local/bin/podgroup-sync, user
# 65532:65532, entrypoint the binary, command `run`, nothing written to the root filesystem.
#
# usage: hack/image.sh [--binary FILE] [--out FILE] [--tag TAG]
#   --binary FILE   use this (static) binary instead of building it
# environment: IMAGE_TARGET_DIR (default $PGS_CACHE/cargo-target-image, PGS_CACHE defaulting to
# ~/.cache/podgroup-sync): cargo's build directory for the static binary
#   --out FILE      the OCI archive (default target/image/podgroup-sync-TAG.oci.tar)
#   --tag TAG       the image tag (default: the crate version)
# The last stdout line is IMAGE=<archive>; the image's name inside is podgroup-sync:TAG
# (org.opencontainers.image.ref.name), which `ctr images import` and `skopeo` understand.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
log() { echo "[image $(date +%H:%M:%S)] $*" >&2; }

BINARY= OUT= TAG=
while [ $# -gt 0 ]; do
  case $1 in
    --binary) BINARY=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --tag) TAG=$2; shift 2 ;;
    *) echo "usage: $0 [--binary FILE] [--out FILE] [--tag TAG]" >&2; exit 2 ;;
  esac
done
TAG=${TAG:-$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)}
OUT=${OUT:-target/image/podgroup-sync-$TAG.oci.tar}

if ! command -v umoci >/dev/null; then
  log "installing umoci (apt-get)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends umoci >&2
fi

if [ -z "$BINARY" ]; then
  # --target keeps the static flag off build scripts and proc macros (they must stay dynamic).
  # The build directory is kept outside the checkout (IMAGE_TARGET_DIR), so that a fresh clone
  # rebuilds only this crate, not its dependencies.
  triple=$(rustc -vV | sed -n 's/^host: //p')
  target_dir=${IMAGE_TARGET_DIR:-${PGS_CACHE:-$HOME/.cache/podgroup-sync}/cargo-target-image}
  log "cargo build --release (static, $triple, in $target_dir)"
  RUSTFLAGS="${RUSTFLAGS:-} -C target-feature=+crt-static" \
    cargo build --release --locked --target "$triple" --target-dir "$target_dir" \
    --bin podgroup-sync >&2
  BINARY=$target_dir/$triple/release/podgroup-sync
fi
if readelf -l "$BINARY" | grep -q 'Requesting program interpreter'; then
  echo "image.sh: $BINARY is dynamically linked; the image has no libc to load it" >&2; exit 1
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/podgroup-sync-image.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/rootfs/usr/local/bin"
install -m 0755 "$BINARY" "$work/rootfs/usr/local/bin/podgroup-sync"
# Fixed times and owners: the same binary gives the same layer digest.
touch -h -d @0 "$work/rootfs" "$work/rootfs/usr" "$work/rootfs/usr/local" \
  "$work/rootfs/usr/local/bin" "$work/rootfs/usr/local/bin/podgroup-sync"

umoci init --layout "$work/layout"
umoci new --image "$work/layout:$TAG"
# The layer is GNU tar's (fixed order, times and owners), added verbatim: `umoci insert` of
# Debian's umoci 0.4.7 writes a layer without the last file's padding and the end-of-archive
# blocks, which containerd accepts and GNU tar and Python's tarfile reject.
tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$work/rootfs" -cf "$work/layer.tar" .
umoci raw add-layer --history.created 1970-01-01T00:00:00Z --history.created_by "hack/image.sh" \
  --image "$work/layout:$TAG" "$work/layer.tar" >&2
umoci config --history.created 1970-01-01T00:00:00Z --history.created_by "hack/image.sh" --image "$work/layout:$TAG" --created 1970-01-01T00:00:00Z \
  --author podgroup-sync --os linux --architecture amd64 \
  --config.user 65532:65532 --config.entrypoint /usr/local/bin/podgroup-sync --config.cmd run \
  --config.exposedports 8080/tcp --config.exposedports 9443/tcp \
  --config.label org.opencontainers.image.title=podgroup-sync \
  --config.label "org.opencontainers.image.version=$TAG"
umoci gc --layout "$work/layout"

mkdir -p "$(dirname "$OUT")"
tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$work/layout" -cf "$OUT.tmp" .
mv "$OUT.tmp" "$OUT"
log "built $OUT ($(du -k "$OUT" | cut -f1) KiB; binary $(du -k "$BINARY" | cut -f1) KiB)"
echo "IMAGE=$OUT"

#!/usr/bin/env bash
# Builds the podgroup-sync container image with no registry and no container engine: the release
# binary linked statically (glibc's static libc, `-C target-feature=+crt-static`) on an empty
# base, assembled into an OCI image archive by hack/oci-archive.sh (Debian's umoci). The layout is the Dockerfile's: /usr/local/bin/podgroup-sync, user
# 65532:65532, entrypoint the binary, command `run`, nothing written to the root filesystem.
#
# usage: hack/image.sh [--binary FILE] [--out FILE] [--tag TAG] [--build-only]
#   --binary FILE   use this (static) binary instead of building it
#   --build-only    build the static binary and stop (CI builds it ahead, see .ci/run)
#   --out FILE      the OCI archive (default target/image/podgroup-sync-TAG.oci.tar)
#   --tag TAG       the image tag (default: the crate version)
# environment: IMAGE_TARGET_DIR (default $PGS_CACHE/cargo-target-image, PGS_CACHE defaulting to
# ~/.cache/podgroup-sync): cargo's build directory for the static binary
# The last stdout line is IMAGE=<archive>; the image's name inside is podgroup-sync:TAG
# (org.opencontainers.image.ref.name), which `ctr images import` and `skopeo` understand.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
log() { echo "[image $(date +%H:%M:%S)] $*" >&2; }

BINARY= OUT= TAG= BUILD_ONLY=0
while [ $# -gt 0 ]; do
  case $1 in
    --binary) BINARY=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --tag) TAG=$2; shift 2 ;;
    --build-only) BUILD_ONLY=1; shift ;;
    *) echo "usage: $0 [--binary FILE] [--out FILE] [--tag TAG] [--build-only]" >&2; exit 2 ;;
  esac
done
TAG=${TAG:-$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)}
OUT=${OUT:-target/image/podgroup-sync-$TAG.oci.tar}

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
[ "$BUILD_ONLY" = 0 ] || { log "built $BINARY"; exit 0; }
if readelf -l "$BINARY" | grep -q 'Requesting program interpreter'; then
  echo "image.sh: $BINARY is dynamically linked; the image has no libc to load it" >&2; exit 1
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/podgroup-sync-image.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/rootfs/usr/local/bin"
install -m 0755 "$BINARY" "$work/rootfs/usr/local/bin/podgroup-sync"

hack/oci-archive.sh "$work/rootfs" "$OUT" "$TAG" hack/image.sh \
  --author podgroup-sync \
  --config.user 65532:65532 --config.entrypoint /usr/local/bin/podgroup-sync --config.cmd run \
  --config.exposedports 8080/tcp --config.exposedports 9443/tcp \
  --config.label org.opencontainers.image.title=podgroup-sync \
  --config.label "org.opencontainers.image.version=$TAG"
log "built $OUT ($(du -k "$OUT" | cut -f1) KiB; binary $(du -k "$BINARY" | cut -f1) KiB)"
echo "IMAGE=$OUT"

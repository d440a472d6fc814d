#!/usr/bin/env bash
# Builds the podgroup-sync container image with no registry and no container engine: the release
# binary linked statically (glibc's static libc, `-C target-feature=+crt-static`) on an empty
# base, for linux/amd64 and linux/arm64 (cross-built with Debian's aarch64 toolchain, installed
# with apt-get when missing, and the toolchain's aarch64 standard library, added with rustup when
# missing), assembled into one OCI image index by hack/oci-archive.sh (Debian's umoci). The layout
# is the Dockerfile's: /usr/local/bin/podgroup-sync and the kubectl plugin's link beside it
# (kubectl-podgroup_sync), user 65532:65532, entrypoint the binary, command `run`, nothing written
# to the root filesystem. Beside the archive: an SPDX SBOM of the crates in the binary
# (hack/sbom.py, from `cargo metadata`).
#
# usage: hack/image.sh [--binary FILE] [--out FILE] [--tag TAG] [--build-only] [--arch ARCHS]
#   --binary FILE   use this (static, amd64) binary instead of building it: a linux/amd64 image
#   --build-only    build the static binaries and stop (CI builds them ahead, see .ci/run)
#   --out FILE      the OCI archive (default target/image/podgroup-sync-TAG.oci.tar)
#   --tag TAG       the image tag (default: the crate version)
#   --arch ARCHS    the architectures, comma-separated (default amd64,arm64)
# environment: IMAGE_TARGET_DIR (default $PGS_CACHE/cargo-target-image, PGS_CACHE defaulting to
# ~/.cache/podgroup-sync): cargo's build directory for the static binaries
# The last stdout line is IMAGE=<archive>; the image's name inside is podgroup-sync:TAG
# (org.opencontainers.image.ref.name), which `ctr images import` and `skopeo` understand; the
# SBOM is <archive without .oci.tar>.spdx.json.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
log() { echo "[image $(date +%H:%M:%S)] $*" >&2; }

BINARY= OUT= TAG= BUILD_ONLY=0 ARCHS=amd64,arm64
while [ $# -gt 0 ]; do
  case $1 in
    --binary) BINARY=$2; ARCHS=amd64; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --tag) TAG=$2; shift 2 ;;
    --build-only) BUILD_ONLY=1; shift ;;
    --arch) ARCHS=$2; shift 2 ;;
    *) echo "usage: $0 [--binary FILE] [--out FILE] [--tag TAG] [--build-only] [--arch ARCHS]" >&2; exit 2 ;;
  esac
done
TAG=${TAG:-$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)}
OUT=${OUT:-target/image/podgroup-sync-$TAG.oci.tar}
target_dir=${IMAGE_TARGET_DIR:-${PGS_CACHE:-$HOME/.cache/podgroup-sync}/cargo-target-image}

triple_of() {
  case $1 in
    amd64) echo x86_64-unknown-linux-gnu ;;
    arm64) echo aarch64-unknown-linux-gnu ;;
    *) echo "image.sh: unknown architecture $1 (amd64, arm64)" >&2; exit 2 ;;
  esac
}

# The aarch64 cross toolchain: Debian's gcc and static glibc for the link (and ring's C), the
# Rust standard library for the target from the toolchain's own distribution.
cross_toolchain() {
  if ! command -v aarch64-linux-gnu-gcc >/dev/null || [ ! -e /usr/aarch64-linux-gnu/lib/libc.a ]; then
    log "installing Debian's aarch64 cross toolchain (apt-get)"
    export DEBIAN_FRONTEND=noninteractive
    pkgs=(gcc-aarch64-linux-gnu libc6-dev-arm64-cross)
    # CI runs this beside the tiers, which use apt too: wait for its lock instead of failing.
    wait_lock=(-o DPkg::Lock::Timeout=900)
    apt-get "${wait_lock[@]}" install -y --no-install-recommends "${pkgs[@]}" >&2 ||
      { apt-get "${wait_lock[@]}" update >&2 &&
        apt-get "${wait_lock[@]}" install -y --no-install-recommends "${pkgs[@]}" >&2; }
  fi
  if ! rustc --print sysroot | xargs -I{} test -d {}/lib/rustlib/aarch64-unknown-linux-gnu; then
    log "adding the aarch64-unknown-linux-gnu standard library (rustup)"
    rustup target add aarch64-unknown-linux-gnu >&2
  fi
  export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
  export CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc AR_aarch64_unknown_linux_gnu=aarch64-linux-gnu-ar
}

IFS=, read -r -a archs <<< "$ARCHS"
declare -A binaries
if [ -n "$BINARY" ]; then
  binaries[amd64]=$BINARY
else
  # --target keeps the static flag off build scripts and proc macros (they must stay dynamic).
  # The build directory is kept outside the checkout (IMAGE_TARGET_DIR), so that a fresh clone
  # rebuilds only this crate, not its dependencies. One cargo run for every target: the build
  # scripts and proc macros are built once.
  targets=()
  for a in "${archs[@]}"; do
    t=$(triple_of "$a")
    targets+=(--target "$t")
    binaries[$a]=$target_dir/$t/release/podgroup-sync
    [ "$a" != arm64 ] || cross_toolchain
  done
  log "cargo build --release (static, ${archs[*]}, in $target_dir)"
  RUSTFLAGS="${RUSTFLAGS:-} -C target-feature=+crt-static" \
    cargo build --release --locked "${targets[@]}" --target-dir "$target_dir" \
    --bin podgroup-sync >&2
fi
[ "$BUILD_ONLY" = 0 ] || { log "built ${binaries[*]}"; exit 0; }

work=$(mktemp -d "${TMPDIR:-/tmp}/podgroup-sync-image.XXXXXX")
trap 'rm -rf "$work"' EXIT
platforms=()
for a in "${archs[@]}"; do
  if readelf -l "${binaries[$a]}" | grep -q 'Requesting program interpreter'; then
    echo "image.sh: ${binaries[$a]} is dynamically linked; the image has no libc to load it" >&2; exit 1
  fi
  mkdir -p "$work/$a/usr/local/bin"
  install -m 0755 "${binaries[$a]}" "$work/$a/usr/local/bin/podgroup-sync"
  # `kubectl podgroup-sync` from the image: `kubectl cp` it out, or mount the image's binary.
  ln -s podgroup-sync "$work/$a/usr/local/bin/kubectl-podgroup_sync"
  platforms+=("$a=$work/$a")
done
rootfs=$(IFS=,; echo "${platforms[*]}")
[ -n "$BINARY" ] && rootfs=$work/amd64

hack/oci-archive.sh "$rootfs" "$OUT" "$TAG" hack/image.sh \
  --author podgroup-sync \
  --config.user 65532:65532 --config.entrypoint /usr/local/bin/podgroup-sync --config.cmd run \
  --config.exposedports 8080/tcp --config.exposedports 9443/tcp \
  --config.label org.opencontainers.image.title=podgroup-sync \
  --config.label "org.opencontainers.image.version=$TAG"
sbom=${OUT%.oci.tar}.spdx.json
sbom_args=()
for a in "${archs[@]}"; do sbom_args+=(--target "$(triple_of "$a")"); done
python3 hack/sbom.py --name "podgroup-sync:$TAG" "${sbom_args[@]}" > "$sbom.tmp"
mv "$sbom.tmp" "$sbom"
log "built $OUT ($(du -k "$OUT" | cut -f1) KiB; ${archs[*]}); SBOM $sbom"
echo "IMAGE=$OUT"

#!/usr/bin/env bash
# The previous release for the node tier's upgrade and rollback: the commit named in
# tests/node/previous-release, its chart and its image built by its own hack/image.sh (a static
# release binary in an OCI archive, tagged <version>-<short commit>), once per machine under
#   $PGS_CACHE/previous/<short commit>/   (PGS_CACHE defaults to ~/.cache/podgroup-sync)
# Its cargo build directory is the current image's (cargo-target-image): the dependencies are
# shared, only the crate itself is compiled again. Needs the commit in this clone's history.
# stdout lines: PREVIOUS_IMAGE=<archive>, PREVIOUS_CHART=<dir>, PREVIOUS_TAG=<tag>.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
log() { echo "[get-previous $(date +%H:%M:%S)] $*" >&2; }
PGS_CACHE=${PGS_CACHE:-$HOME/.cache/podgroup-sync}
commit=$(sed -n 's/^commit=//p' tests/node/previous-release)
short=${commit:0:7}
dir=$PGS_CACHE/previous/$short
if ! git cat-file -e "$commit^{commit}" 2>/dev/null; then
  echo "get-previous.sh: commit $commit is not in this clone's history (a shallow clone?): git fetch --unshallow" >&2
  exit 1
fi
version=$(git show "$commit:Cargo.toml" | sed -n 's/^version = "\(.*\)"/\1/p' | head -n 1)
tag=$version-$short
mkdir -p "$PGS_CACHE/previous"
exec 9>>"$PGS_CACHE/previous/.lock"
flock 9
if [ ! -f "$dir/image.oci.tar" ]; then
  log "building the previous release $short (its own hack/image.sh)"
  rm -rf "$dir.tmp"
  mkdir -p "$dir.tmp/src"
  git archive "$commit" | tar -x -C "$dir.tmp/src"
  (cd "$dir.tmp/src" &&
    IMAGE_TARGET_DIR=${IMAGE_TARGET_DIR:-$PGS_CACHE/cargo-target-image} \
      hack/image.sh --tag "$tag" --out "$dir.tmp/image.oci.tar" >&2)
  rm -rf "$dir"
  mv "$dir.tmp" "$dir"
fi
echo "PREVIOUS_IMAGE=$dir/image.oci.tar"
echo "PREVIOUS_CHART=$dir/src/chart/podgroup-sync"
echo "PREVIOUS_TAG=$tag"

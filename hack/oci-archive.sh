#!/usr/bin/env bash
# Assembles a one-layer OCI image archive from a root filesystem directory, reproducibly (fixed
# order, times and owners: the same files give the same digest), with Debian's umoci (installed
# with apt-get when missing). Used by hack/image.sh and tests/node/get-node.sh.
#
# usage: oci-archive.sh ROOTFS OUT TAG CREATED_BY [UMOCI_CONFIG_ARGS...]
#   ROOTFS              the layer's content (its times and owners are normalised in the layer)
#   OUT                 the archive to write (an OCI image layout, tarred)
#   TAG                 the tag inside it (org.opencontainers.image.ref.name)
#   CREATED_BY          the history entry's created_by
#   UMOCI_CONFIG_ARGS   passed to `umoci config` (--config.user, --config.entrypoint, ...)
set -euo pipefail
[ $# -ge 4 ] || { echo "usage: $0 ROOTFS OUT TAG CREATED_BY [UMOCI_CONFIG_ARGS...]" >&2; exit 2; }
ROOTFS=$1 OUT=$2 TAG=$3 CREATED_BY=$4; shift 4

if ! command -v umoci >/dev/null; then
  echo "[oci-archive] installing umoci (apt-get)" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y --no-install-recommends umoci >&2 ||
    { apt-get update >&2 && apt-get install -y --no-install-recommends umoci >&2; }
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/podgroup-sync-oci.XXXXXX")
trap 'rm -rf "$work"' EXIT
stamp=(--history.created 1970-01-01T00:00:00Z --history.created_by "$CREATED_BY")
normalised=(--sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner)

umoci init --layout "$work/layout"
umoci new --image "$work/layout:$TAG"
# The layer is GNU tar's, added verbatim: `umoci insert` of Debian's umoci 0.4.7 writes a layer
# without the last file's padding and the end-of-archive blocks, which containerd accepts and
# GNU tar and Python's tarfile reject.
tar "${normalised[@]}" -C "$ROOTFS" -cf "$work/layer.tar" .
umoci raw add-layer "${stamp[@]}" --image "$work/layout:$TAG" "$work/layer.tar" >&2
umoci config "${stamp[@]}" --image "$work/layout:$TAG" --created 1970-01-01T00:00:00Z \
  --os linux --architecture amd64 "$@"
umoci gc --layout "$work/layout"

mkdir -p "$(dirname "$OUT")"
tar "${normalised[@]}" -C "$work/layout" -cf "$OUT.tmp" .
mv "$OUT.tmp" "$OUT"

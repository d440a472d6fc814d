#!/usr/bin/env bash
# Assembles a one-layer OCI image archive from a root filesystem directory, reproducibly (fixed
# order, times and owners: the same files give the same digest), with Debian's umoci (installed
# with apt-get when missing). Used by hack/image.sh and tests/node/get-node.sh.
#
# usage: oci-archive.sh ROOTFS OUT TAG CREATED_BY [UMOCI_CONFIG_ARGS...]
#   ROOTFS              the layer's content (its times and owners are normalised in the layer):
#                       a directory (one linux/amd64 image), or ARCH=DIR[,ARCH=DIR...] (one
#                       image per architecture, tagged TAG by an OCI image index naming each
#                       manifest's platform, as a registry serves a multi-architecture image)
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

# one_image ARCH DIR IMAGE: a one-layer image of DIR for linux/ARCH, tagged IMAGE in the layout.
one_image() {
  local arch=$1 dir=$2 image=$3 layer=$work/layer-$1.tar
  umoci new --image "$work/layout:$image"
  # The layer is GNU tar's, added verbatim: `umoci insert` of Debian's umoci 0.4.7 writes a layer
  # without the last file's padding and the end-of-archive blocks, which containerd accepts and
  # GNU tar and Python's tarfile reject.
  tar "${normalised[@]}" -C "$dir" -cf "$layer" .
  umoci raw add-layer "${stamp[@]}" --image "$work/layout:$image" "$layer" >&2
  umoci config "${stamp[@]}" --image "$work/layout:$image" --created 1970-01-01T00:00:00Z \
    --os linux --architecture "$arch" "${config[@]}"
}

config=("$@")
umoci init --layout "$work/layout"
if [ -d "$ROOTFS" ]; then
  one_image amd64 "$ROOTFS" "$TAG"
  umoci gc --layout "$work/layout"
else
  archs=()
  IFS=, read -r -a platforms <<< "$ROOTFS"
  for p in "${platforms[@]}"; do
    [ -d "${p#*=}" ] || { echo "oci-archive.sh: ${p#*=} is no directory" >&2; exit 2; }
    one_image "${p%%=*}" "${p#*=}" "$TAG-${p%%=*}"
    archs+=("${p%%=*}")
  done
  umoci gc --layout "$work/layout"
  # The per-architecture manifests under one index blob, which the layout's index.json names TAG
  # (canonical JSON: the same manifests give the same digest).
  python3 - "$work/layout" "$TAG" "${archs[@]}" <<'PY_INDEX'
import hashlib, json, os, sys
layout, tag, archs = sys.argv[1], sys.argv[2], sys.argv[3:]
REF = "org.opencontainers.image.ref.name"
INDEX = "application/vnd.oci.image.index.v1+json"
with open(os.path.join(layout, "index.json")) as f:
    top = json.load(f)
by_ref = {m["annotations"][REF]: m for m in top["manifests"]}
manifests = []
for arch in archs:
    m = dict(by_ref[f"{tag}-{arch}"])
    m.pop("annotations", None)
    m["platform"] = {"architecture": arch, "os": "linux"}
    manifests.append(m)
blob = json.dumps({"schemaVersion": 2, "mediaType": INDEX, "manifests": manifests},
                  sort_keys=True, separators=(",", ":")).encode()
digest = hashlib.sha256(blob).hexdigest()
with open(os.path.join(layout, "blobs", "sha256", digest), "wb") as f:
    f.write(blob)
top["manifests"] = [{"mediaType": INDEX, "digest": f"sha256:{digest}", "size": len(blob),
                     "annotations": {REF: tag}}]
with open(os.path.join(layout, "index.json"), "w") as f:
    json.dump(top, f, sort_keys=True, separators=(",", ":"))
PY_INDEX
fi

mkdir -p "$(dirname "$OUT")"
tar "${normalised[@]}" -C "$work/layout" -cf "$OUT.tmp" .
mv "$OUT.tmp" "$OUT"

#!/usr/bin/env bash
# Obtains promtool and the prometheus server (once) from Debian's `prometheus` package without
# installing the package or its service: the .deb is downloaded with `apt-get download` and unpacked with `dpkg-deb -x` into
#   $PGS_CACHE/promtool-<package version>/        (PGS_CACHE defaults to ~/.cache/podgroup-sync)
# `apt-get update` runs only when the download fails (a fresh machine has no package lists).
# Idempotent and safe to run concurrently; progress goes to stderr, and the last lines of stdout
# are "PROMTOOL=<path>" and "PROMETHEUS=<path>" (the server, beside it; the end-to-end tier runs it).
#
# environment:
#   PROMTOOL=<path>   use this promtool instead (it is checked, then echoed back)
set -euo pipefail

PGS_CACHE=${PGS_CACHE:-$HOME/.cache/podgroup-sync}
log() { echo "[get-promtool $(date +%H:%M:%S)] $*" >&2; }

# works PATH: PATH is a promtool that runs on this machine.
works() { [ -x "$1" ] && "$1" --version >/dev/null 2>&1; }

if [ -n "${PROMTOOL:-}" ]; then
  works "$PROMTOOL" || { log "PROMTOOL=$PROMTOOL does not run"; exit 1; }
  echo "PROMTOOL=$PROMTOOL"
  echo "PROMETHEUS=${PROMETHEUS:-$(dirname "$PROMTOOL")/prometheus}"
  exit 0
fi

# cached: the newest promtool already unpacked into the cache, if any.
cached() {
  local p
  for p in $(ls -d "$PGS_CACHE"/promtool-*/usr/bin/promtool 2>/dev/null | sort -V -r); do
    if works "$p" && works "$(dirname "$p")/prometheus"; then echo "$p"; return 0; fi
  done
  return 1
}

mkdir -p "$PGS_CACHE"
if p=$(cached); then echo "PROMTOOL=$p"; echo "PROMETHEUS=$(dirname "$p")/prometheus"; exit 0; fi

# One download at a time per cache (test binaries may ask concurrently).
exec 9>>"$PGS_CACHE/.get-promtool.lock"
if ! flock -n 9; then
  log "waiting for another get-promtool.sh run to finish"
  flock 9
fi
if p=$(cached); then echo "PROMTOOL=$p"; echo "PROMETHEUS=$(dirname "$p")/prometheus"; exit 0; fi

for tool in apt-get dpkg-deb; do
  command -v "$tool" >/dev/null || { log "$tool not found: this script needs a Debian-based machine"; exit 1; }
done

# The .deb goes to a directory apt's unprivileged sandbox user can write (not under a 0700 home);
# the unpacked tree is staged inside the cache so the final rename stays on one filesystem.
DL=$(mktemp -d)
TMP=$(mktemp -d "$PGS_CACHE/.promtool.XXXXXX")
trap 'rm -rf "$DL" "$TMP"' EXIT
chmod 0777 "$DL"
cd "$DL"
if ! apt-get download prometheus >&2; then
  log "apt-get download failed; running apt-get update once and retrying"
  apt-get update >&2
  apt-get download prometheus >&2
fi
deb=$(ls "$DL"/prometheus_*.deb)
version=$(dpkg-deb -f "$deb" Version)
dir=$PGS_CACHE/promtool-${version//[:\/]/_}
log "unpacking promtool from prometheus $version"
dpkg-deb -x "$deb" "$TMP/root"
works "$TMP/root/usr/bin/promtool" || { log "the unpacked promtool does not run"; exit 1; }
# Keep only promtool and prometheus; the rename makes them appear in the cache complete or not at
# all.
mkdir -p "$TMP/keep/usr/bin"
mv "$TMP/root/usr/bin/promtool" "$TMP/root/usr/bin/prometheus" "$TMP/keep/usr/bin/"
rm -rf "$dir"
mv "$TMP/keep" "$dir"
log "$("$dir/usr/bin/promtool" --version 2>&1 | head -1)"
echo "PROMTOOL=$dir/usr/bin/promtool"
echo "PROMETHEUS=$dir/usr/bin/prometheus"

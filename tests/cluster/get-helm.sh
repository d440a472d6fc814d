#!/usr/bin/env bash
# Builds (once) helm v3 from its Go module with `go install`, for the chart tests. Idempotent; the
# binary is cached outside the repo in $PGS_CACHE/bin/helm-<version>-<goversion>/helm.
# The ldflags set helm's version and its default .Capabilities.KubeVersion (and the lint
# deprecation check's target) to the test control plane's minor (K8S_VERSION, as in
# get-binaries.sh), so `helm template`/`helm lint` judge the chart against that Kubernetes.
# The last line of stdout is "HELM=<path>"; progress goes to stderr.
#
# usage: get-helm.sh
set -euo pipefail

HELM_VERSION=${HELM_VERSION:-3.21.4}
K8S_VERSION=${K8S_VERSION:-1.34.4}

export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=
PGS_CACHE=${PGS_CACHE:-$HOME/.cache/podgroup-sync}
GOV=$(go env GOVERSION)
K8S_MINOR=${K8S_VERSION#1.}; K8S_MINOR=${K8S_MINOR%%.*}
DIR=$PGS_CACHE/bin/helm-v$HELM_VERSION-k8s1.$K8S_MINOR-$GOV
HELM=$DIR/helm

log() { echo "[get-helm $(date +%H:%M:%S)] $*" >&2; }

mkdir -p "$DIR"
exec 9>>"$DIR/.lock"
if ! flock -n 9; then
  log "waiting for another get-helm.sh run to finish"
  flock 9
fi

if [ ! -x "$HELM" ]; then
  log "building helm v$HELM_VERSION with $GOV (cold: a few minutes on 2 cores)"
  start=$(date +%s)
  rm -rf "$DIR/.build"; mkdir -p "$DIR/.build"
  ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=v$HELM_VERSION"
  ldflags+=" -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
  for pkg in helm.sh/helm/v3/pkg/chartutil helm.sh/helm/v3/pkg/lint/rules; do
    ldflags+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$K8S_MINOR"
  done
  # Outside any module, so a go.mod in the working directory cannot interfere.
  (cd /tmp && GOBIN="$DIR/.build" go install -trimpath -ldflags "$ldflags" \
    "helm.sh/helm/v3/cmd/helm@v$HELM_VERSION")
  mv "$DIR/.build/helm" "$HELM"
  rmdir "$DIR/.build"
  log "built in $(( $(date +%s) - start ))s: $("$HELM" version --short)"
fi

echo "HELM=$HELM"

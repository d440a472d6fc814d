#!/usr/bin/env bash
# Builds (once) the Kubernetes components the tests run, from the Go module proxy, and fetches the
# upstream CRD manifests from their Go modules. Idempotent; everything is cached outside the repo:
#   $PGS_CACHE/bin/<component>-<version>-<goversion>/   binaries
#   $PGS_CACHE/crds/                                    CRD manifests
# Its last two lines of stdout are "BIN=<dir>" and "CRDS=<dir>"; progress goes to stderr.
# Concurrent runs are serialised by a lock, and binaries appear in BIN only once fully built.
#
# usage: get-binaries.sh
# environment: K8S_VERSION (default 1.34.4); K8S_SCHEDULER=1 also builds kube-scheduler (the
# native-backend tier runs kube-scheduler v1.37 itself, the 1.34 tiers run the schedulers' own
# binaries); K8S_NODE=1 also builds kube-scheduler, kubelet and kube-proxy (the node tier). A directory per
# version, so 1.34 and 1.37 live side by side.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=../lib.sh
. "$HERE/../lib.sh"

K8S_VERSION=${K8S_VERSION:-1.34.4}
ETCD_VERSION=${ETCD_VERSION:-3.6.5}
TRAINING_OPERATOR_VERSION=${TRAINING_OPERATOR_VERSION:-1.9.4}
MPI_OPERATOR_VERSION=${MPI_OPERATOR_VERSION:-0.8.0}
SCHEDULER_PLUGINS_VERSION=${SCHEDULER_PLUGINS_VERSION:-0.34.7}
VOLCANO_VERSION=${VOLCANO_VERSION:-1.15.1}  # the proxy refuses 1.13.x and 1.14.x
# The workloads of SPEC §11 (the same versions as tests/e2e/get-e2e-binaries.sh builds).
JOBSET_VERSION=${JOBSET_VERSION:-0.12.0}
LWS_VERSION=${LWS_VERSION:-0.9.0}
KUBERAY_VERSION=${KUBERAY_VERSION:-1.6.0}
TRAINER_VERSION=${TRAINER_VERSION:-2.3.0}

export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod
PGS_CACHE=${PGS_CACHE:-$HOME/.cache/podgroup-sync}
GOV=$(go env GOVERSION)
BIN=$PGS_CACHE/bin/k8s-v$K8S_VERSION-etcd-v$ETCD_VERSION-$GOV
CRDS=$PGS_CACHE/crds/v3-to-v$TRAINING_OPERATOR_VERSION-mpi-v$MPI_OPERATOR_VERSION-sp-v$SCHEDULER_PLUGINS_VERSION-vc-v$VOLCANO_VERSION-js-v$JOBSET_VERSION-lws-v$LWS_VERSION-ray-v$KUBERAY_VERSION-tr-v$TRAINER_VERSION
mkdir -p "$BIN" "$CRDS" "$PGS_CACHE/src"

log() { echo "[get-binaries $(date +%H:%M:%S)] $*" >&2; }

K8S_CMDS="kube-apiserver kube-controller-manager kubectl"
[ "${K8S_SCHEDULER:-0}" = 1 ] && K8S_CMDS="$K8S_CMDS kube-scheduler"
[ "${K8S_NODE:-0}" = 1 ] && K8S_CMDS="$K8S_CMDS kube-scheduler kubelet kube-proxy"

# Everything this run needs is there (binaries appear only once fully built): no lock, so a
# control plane never waits behind another run building other components (CI's prefetch of the
# node's or the 1.37 binaries).
all_built() {
  local c
  [ -f "$CRDS/.done" ] && [ -x "$BIN/etcd" ] || return 1
  for c in $K8S_CMDS; do [ -x "$BIN/$c" ] || return 1; done
}
if all_built; then
  echo "BIN=$BIN"
  echo "CRDS=$CRDS"
  exit 0
fi

# One run at a time per cache (test binaries may start control planes concurrently).
one_run_at_a_time "$PGS_CACHE/.get-binaries.lock" get-binaries.sh

build_kubernetes() {
  local c missing=0
  for c in $K8S_CMDS; do [ -x "$BIN/$c" ] || missing=1; done
  [ "$missing" = 0 ] && return
  local staging=v0.${K8S_VERSION#1.}
  local w=$PGS_CACHE/src/k8s-v$K8S_VERSION
  log "building $K8S_CMDS v$K8S_VERSION (cold: ~15-30 min on 2 cores)"
  rm -rf "$w"; mkdir -p "$w"
  local kmod; kmod=$(modjson "k8s.io/kubernetes@v$K8S_VERSION" GoMod)
  ( cd "$w"
    { echo "module local/k8s-testbin"; grep -E '^(go|godebug) ' "$kmod"; } > go.mod
    go mod edit -require="k8s.io/kubernetes@v$K8S_VERSION"
    replace_flags "$kmod" "$staging" | xargs go mod edit
    for c in $K8S_CMDS; do go mod edit -tool="k8s.io/kubernetes/cmd/$c"; done
    log "go mod tidy (downloads ~0.5 GB of modules when cold)"
    go mod tidy
    local ldf; ldf=$(k8s_ldflags "$K8S_VERSION")
    log "go build (this is the slow part)"
    rm -rf "$BIN/.build"; mkdir -p "$BIN/.build"
    # shellcheck disable=SC2046
    go build -trimpath -ldflags "$ldf" -o "$BIN/.build/" $(printf 'k8s.io/kubernetes/cmd/%s ' $K8S_CMDS)
    mv "$BIN"/.build/* "$BIN/"; rmdir "$BIN/.build"
  )
  log "built $("$BIN/kube-apiserver" --version)"
}

build_etcd() {
  [ -x "$BIN/etcd" ] && return
  local w=$PGS_CACHE/src/etcd-v$ETCD_VERSION
  log "building etcd v$ETCD_VERSION (cold: a few minutes)"
  rm -rf "$w"; mkdir -p "$w"
  ( cd "$w"
    printf 'module local/etcd-testbin\n\ngo 1.24\n' > go.mod
    go mod edit -require="go.etcd.io/etcd/server/v3@v$ETCD_VERSION" -tool=go.etcd.io/etcd/server/v3
    go mod tidy
    go build -trimpath -ldflags "-s -w" -o "$BIN/.etcd.tmp" go.etcd.io/etcd/server/v3
    mv "$BIN/.etcd.tmp" "$BIN/etcd"
  )
  log "built etcd $("$BIN/etcd" --version | head -1)"
}

fetch_crds() {
  [ -f "$CRDS/.done" ] && return
  log "fetching CRD manifests from the upstream Go modules"
  local d
  d=$(modjson "github.com/kubeflow/training-operator@v$TRAINING_OPERATOR_VERSION" Dir)
  mkdir -p "$CRDS/training-operator" "$CRDS/mpi-operator" "$CRDS/scheduler-plugins" "$CRDS/volcano"
  cp "$d"/manifests/base/crds/kubeflow.org_{pytorchjobs,tfjobs,mpijobs,xgboostjobs,paddlejobs,jaxjobs}.yaml "$CRDS/training-operator/"
  d=$(modjson "github.com/kubeflow/mpi-operator@v$MPI_OPERATOR_VERSION" Dir)
  cp "$d/manifests/base/kubeflow.org_mpijobs.yaml" "$CRDS/mpi-operator/"
  d=$(modjson "sigs.k8s.io/scheduler-plugins@v$SCHEDULER_PLUGINS_VERSION" Dir)
  cp "$d/manifests/coscheduling/crd.yaml" "$CRDS/scheduler-plugins/scheduling.x-k8s.io_podgroups.yaml"  # manifests/crds/ holds symlinks, left out of module zips
  d=$(modjson "volcano.sh/volcano@v$VOLCANO_VERSION" Dir)
  cp "$d"/config/crd/volcano/bases/scheduling.volcano.sh_{podgroups,queues}.yaml "$CRDS/volcano/"
  mkdir -p "$CRDS/workloads"
  d=$(modjson "sigs.k8s.io/jobset@v$JOBSET_VERSION" Dir)
  cp "$d/config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml" "$CRDS/workloads/"
  d=$(modjson "sigs.k8s.io/lws@v$LWS_VERSION" Dir)
  cp "$d/config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml" "$CRDS/workloads/"
  d=$(modjson "github.com/ray-project/kuberay/ray-operator@v$KUBERAY_VERSION" Dir)
  cp "$d"/config/crd/bases/ray.io_{rayclusters,rayjobs}.yaml "$CRDS/workloads/"
  d=$(modjson "github.com/kubeflow/trainer/v2@v$TRAINER_VERSION" Dir)
  cp "$d"/manifests/base/crds/trainer.kubeflow.org_{trainjobs,trainingruntimes,clustertrainingruntimes}.yaml "$CRDS/workloads/"
  chmod -R u+w "$CRDS"
  touch "$CRDS/.done"
}

fetch_crds
build_etcd
build_kubernetes
echo "BIN=$BIN"
echo "CRDS=$CRDS"

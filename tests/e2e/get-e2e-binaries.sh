#!/usr/bin/env bash
# Builds (once) the components of the end-to-end tier from the Go module proxy, and copies the
# upstream manifests they need from their Go modules. Idempotent; everything is cached outside
# the repo, one directory per component, version and Go version:
#   $PGS_CACHE/bin/<component>-<version>-<goversion>/
# Each directory holds the binaries (and, for kwok, scheduler-plugins and volcano, the upstream
# YAML the tests apply); it counts as built only when its `.done` marker (written after a
# complete build, naming the recipe) and every binary are there.
#
# usage: get-e2e-binaries.sh [COMPONENT...]
#   COMPONENT: kwok scheduler-plugins volcano training-operator mpi-operator jobset lws kuberay
#              trainer kueue
#   (default: these, in that order). Builds run one after another (the machines have 2 cores).
#
# stdout: NAME=path lines, one per artefact:
#   KWOK KWOK_STAGES KWOK_STAGE_CRD SCHEDULER_PLUGINS SCHEDULER_PLUGINS_CONTROLLER
#   SCHEDULER_PLUGINS_CRDS VOLCANO_SCHEDULER VOLCANO_CONTROLLER_MANAGER VOLCANO_CRDS
#   TRAINING_OPERATOR MPI_OPERATOR JOBSET JOBSET_CRDS LWS LWS_CRDS KUBERAY KUBERAY_CRDS TRAINER
#   TRAINER_CRDS KUEUE KUEUE_CRDS KUEUE_WEBHOOKS
# stderr: progress, with the wall time of each build that had to run.
# environment: PGS_CACHE (default ~/.cache/podgroup-sync) and the variables below.
# Measured on the 2-core machine (first build; the Go build cache already held the control
# plane's k8s 1.34.4 packages): kwok 4 min, scheduler-plugins 3.5 min, volcano 5-10 min,
# training-operator 2.5 min, mpi-operator 3-5 min; with a warm Go build cache 10-30 s each.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=../lib.sh
. "$HERE/../lib.sh"

KWOK_VERSION=${KWOK_VERSION:-0.8.0}
SCHEDULER_PLUGINS_VERSION=${SCHEDULER_PLUGINS_VERSION:-0.34.7}
TRAINING_OPERATOR_VERSION=${TRAINING_OPERATOR_VERSION:-1.9.4}
MPI_OPERATOR_VERSION=${MPI_OPERATOR_VERSION:-0.8.0}
# The workloads of SPEC §11. The newest versions the proxy served on 2026-12-04 (it refused
# jobset v0.13.0, lws v0.10.0 and ray-operator v1.7.0). Trainer v2.3.0 was the newest it served
# on 2026-12-06 (v2.4.0 refused); it links k8s 0.36.2 like lws v0.9.0, so the two share compiled
# packages.
JOBSET_VERSION=${JOBSET_VERSION:-0.12.0}
LWS_VERSION=${LWS_VERSION:-0.9.0}
KUBERAY_VERSION=${KUBERAY_VERSION:-1.6.0}
TRAINER_VERSION=${TRAINER_VERSION:-2.3.0}
# SPEC §12: Kueue v0.17.0, the only version the proxy served on 2026-12-06. It links k8s 0.35.3.
KUEUE_VERSION=${KUEUE_VERSION:-0.17.0}
# Kubernetes libraries the schedulers are built against, when not the ones their go.mod pins
# (same minor only). scheduler-plugins v0.34.7 pins k8s 1.34.7, but the proxy refuses some of
# its staging modules at v0.34.7 (k8s.io/cluster-bootstrap: 403); 1.34.4 is the control plane's
# version, so its compiled packages are shared with tests/cluster/get-binaries.sh's build.
SCHEDULER_PLUGINS_K8S=${SCHEDULER_PLUGINS_K8S:-1.34.4}
# Volcano: every release since 1.14 replaces volcano.sh/apis with its own staging directory (a
# nested module, absent from the module zip), so the wrapper uses the published volcano.sh/apis.
# The proxy serves volcano.sh/volcano v1.14.1, v1.15.0 and v1.15.1 but volcano.sh/apis only at
# v1.9.0, v1.13.0 and v1.14.0 (v1.15.x: 403), and volcano v1.15.1 does not compile against
# apis v1.14.0 (undefined: QueueAllocationGateKey). So the tier runs Volcano v1.14.1 with
# volcano.sh/apis v1.14.0; its PodGroup and Queue CRDs equal v1.15.1's but for a generator
# annotation. It pins k8s 1.34.1; 1.34.4 shares the control plane's compiled packages.
VOLCANO_VERSION=${VOLCANO_VERSION:-1.14.1}
VOLCANO_APIS_VERSION=${VOLCANO_APIS_VERSION:-v1.14.0}
VOLCANO_K8S=${VOLCANO_K8S:-1.34.4}

export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod
PGS_CACHE=${PGS_CACHE:-$HOME/.cache/podgroup-sync}
GOV=$(go env GOVERSION)
mkdir -p "$PGS_CACHE/bin" "$PGS_CACHE/src"

log() { echo "[get-e2e-binaries $(date +%H:%M:%S)] $*" >&2; }

# One run at a time per cache. A lock of its own, so a long e2e build never blocks the
# control-plane tests' get-binaries.sh.
one_run_at_a_time "$PGS_CACHE/.get-e2e-binaries.lock" get-e2e-binaries.sh

# module_k8s_version GOMOD: the k8s.io/kubernetes version a module's replace (or require) pins.
module_k8s_version() {
  go mod edit -json "$1" | python3 -c '
import json, sys
d = json.load(sys.stdin)
for r in d.get("Replace") or []:
    if r["Old"]["Path"] == "k8s.io/kubernetes" and r["New"].get("Version"):
        print(r["New"]["Version"].lstrip("v")); sys.exit()
for r in d.get("Require") or []:
    if r["Path"] == "k8s.io/kubernetes":
        print(r["Version"].lstrip("v")); sys.exit()
sys.exit("no k8s.io/kubernetes in " + sys.argv[1])
' "$1"
}

# built DIR RECIPE BINARY...: DIR holds a complete build (its marker and every binary) made by
# the same RECIPE (e.g. the Kubernetes version a scheduler was built against).
built() {
  local dir=$1 recipe=$2 b; shift 2
  [ -f "$dir/.done" ] && [ "$(cat "$dir/.done")" = "$recipe" ] || return 1
  for b in "$@"; do [ -x "$dir/$b" ] || return 1; done
}

T_BUILD=0
begin() { T_BUILD=$SECONDS; log "building $1 (cold: several minutes on 2 cores)"; }
finish() {  # finish DIR NAME RECIPE: mark DIR complete and record the build's wall time
  local s=$(( SECONDS - T_BUILD ))
  echo "$s" > "$1/.build-seconds"
  echo "$3" > "$1/.done"
  log "built $2 in ${s}s"
}

# wrapper_build DIR NAME MODULE VERSION LOCALVERSION K8S LDFLAGS PKG...: a throw-away module
# that requires MODULE, repeats its go/godebug lines and replace directives (see replace_flags
# for LOCALVERSION and K8S), and builds PKG... Used for every component, also those without
# replace directives: `go install PKG@VERSION` also reads the module's version list to check for
# deprecation, and the proxy refuses that list for some modules (github.com/kubeflow/mpi-operator:
# 403), while exact versions resolve.
wrapper_build() {
  local dir=$1 name=$2 mod=$3 ver=$4 localver=$5 k8s=$6 ldflags=$7; shift 7
  local gomod; gomod=$(modjson "$mod@v$ver" GoMod)
  local w=$PGS_CACHE/src/$name-v$ver
  rm -rf "$w"; mkdir -p "$w"
  ( cd "$w"
    { echo "module local/$name-testbin"; grep -E '^(go|godebug) ' "$gomod"; } > go.mod
    go mod edit -require="$mod@v$ver"
    replace_flags "$gomod" "$localver" "$k8s" | xargs -r go mod edit
    local p; for p in "$@"; do go mod edit -tool="$p"; done
    log "$name: go mod tidy"
    go mod tidy
    log "$name: go build $*"
    rm -rf "$dir/.build"; mkdir -p "$dir/.build"
    go build -trimpath -ldflags "$ldflags" -o "$dir/.build/" "$@"
    mv "$dir"/.build/* "$dir/"; rmdir "$dir/.build"
  )
}

build_kwok() {
  local dir=$PGS_CACHE/bin/kwok-v$KWOK_VERSION-$GOV
  if ! built "$dir" "" kwok; then
    begin "kwok v$KWOK_VERSION"
    rm -rf "$dir"; mkdir -p "$dir/stages"
    wrapper_build "$dir" kwok sigs.k8s.io/kwok "$KWOK_VERSION" unused "" "-s -w" sigs.k8s.io/kwok/cmd/kwok
    local src; src=$(modjson "sigs.k8s.io/kwok@v$KWOK_VERSION" Dir)
    cp "$src/kustomize/crd/bases/kwok.x-k8s.io_stages.yaml" "$dir/"
    cp "$src"/kustomize/stage/node/fast/node-initialize.yaml \
       "$src"/kustomize/stage/pod/fast/pod-ready.yaml \
       "$src"/kustomize/stage/pod/fast/pod-complete.yaml \
       "$src"/kustomize/stage/pod/fast/pod-delete.yaml "$dir/stages/"
    chmod -R u+w "$dir"
    finish "$dir" kwok ""
  fi
  echo "KWOK=$dir/kwok"
  echo "KWOK_STAGES=$dir/stages"
  echo "KWOK_STAGE_CRD=$dir/kwok.x-k8s.io_stages.yaml"
}

build_scheduler_plugins() {
  local v=$SCHEDULER_PLUGINS_VERSION
  local dir=$PGS_CACHE/bin/scheduler-plugins-v$v-$GOV
  if ! built "$dir" "k8s=$SCHEDULER_PLUGINS_K8S" scheduler controller; then
    begin "scheduler-plugins v$v (scheduler + controller)"
    rm -rf "$dir"; mkdir -p "$dir/crds"
    local gomod src k8s
    gomod=$(modjson "sigs.k8s.io/scheduler-plugins@v$v" GoMod)
    src=$(modjson "sigs.k8s.io/scheduler-plugins@v$v" Dir)
    k8s=${SCHEDULER_PLUGINS_K8S:-$(module_k8s_version "$gomod")}
    log "scheduler-plugins v$v against Kubernetes $k8s"
    # The binary's version must be the Kubernetes one it links: kube-scheduler derives its
    # compatibility version from it (the scheduler-plugins release tag would read as "0.34").
    wrapper_build "$dir" scheduler-plugins sigs.k8s.io/scheduler-plugins "$v" unused \
      "$SCHEDULER_PLUGINS_K8S" "$(k8s_ldflags "$k8s")" \
      sigs.k8s.io/scheduler-plugins/cmd/scheduler sigs.k8s.io/scheduler-plugins/cmd/controller
    # manifests/crds/ holds symlinks, which module zips leave out.
    cp "$src/manifests/coscheduling/crd.yaml" "$dir/crds/scheduling.x-k8s.io_podgroups.yaml"
    cp "$src/manifests/capacityscheduling/crd.yaml" "$dir/crds/scheduling.x-k8s.io_elasticquotas.yaml"
    chmod -R u+w "$dir"
    finish "$dir" scheduler-plugins "k8s=$SCHEDULER_PLUGINS_K8S"
  fi
  echo "SCHEDULER_PLUGINS=$dir/scheduler"
  echo "SCHEDULER_PLUGINS_CONTROLLER=$dir/controller"
  echo "SCHEDULER_PLUGINS_CRDS=$dir/crds"
}

build_volcano() {
  local v=$VOLCANO_VERSION
  local dir=$PGS_CACHE/bin/volcano-v$v-$GOV
  if ! built "$dir" "k8s=$VOLCANO_K8S apis=$VOLCANO_APIS_VERSION" scheduler controller-manager; then
    begin "volcano v$v (scheduler + controller-manager; volcano.sh/apis $VOLCANO_APIS_VERSION)"
    rm -rf "$dir"; mkdir -p "$dir/crds"
    local gomod src k8s
    gomod=$(modjson "volcano.sh/volcano@v$v" GoMod)
    src=$(modjson "volcano.sh/volcano@v$v" Dir)
    k8s=${VOLCANO_K8S:-$(module_k8s_version "$gomod")}
    log "volcano v$v against Kubernetes $k8s"
    # volcano.sh/apis => ./staging/src/volcano.sh/apis becomes the published volcano.sh/apis at
    # VOLCANO_APIS_VERSION (see the top).
    wrapper_build "$dir" volcano volcano.sh/volcano "$v" "$VOLCANO_APIS_VERSION" "$VOLCANO_K8S" \
      "$(k8s_ldflags "$k8s") -X volcano.sh/volcano/pkg/version.Version=v$v" \
      volcano.sh/volcano/cmd/scheduler volcano.sh/volcano/cmd/controller-manager
    cp "$src"/config/crd/volcano/bases/*.yaml "$dir/crds/"
    chmod -R u+w "$dir"
    finish "$dir" volcano "k8s=$VOLCANO_K8S apis=$VOLCANO_APIS_VERSION"
  fi
  echo "VOLCANO_SCHEDULER=$dir/scheduler"
  echo "VOLCANO_CONTROLLER_MANAGER=$dir/controller-manager"
  echo "VOLCANO_CRDS=$dir/crds"
}

build_training_operator() {
  local v=$TRAINING_OPERATOR_VERSION
  local dir=$PGS_CACHE/bin/training-operator-v$v-$GOV
  if ! built "$dir" "" training-operator.v1; then
    begin "training-operator v$v"
    rm -rf "$dir"; mkdir -p "$dir"
    wrapper_build "$dir" training-operator github.com/kubeflow/training-operator "$v" unused "" \
      "-s -w" github.com/kubeflow/training-operator/cmd/training-operator.v1
    finish "$dir" training-operator ""
  fi
  echo "TRAINING_OPERATOR=$dir/training-operator.v1"
}

build_mpi_operator() {
  local v=$MPI_OPERATOR_VERSION
  local dir=$PGS_CACHE/bin/mpi-operator-v$v-$GOV
  if ! built "$dir" "" mpi-operator; then
    begin "mpi-operator v$v"
    rm -rf "$dir"; mkdir -p "$dir"
    wrapper_build "$dir" mpi-operator github.com/kubeflow/mpi-operator "$v" unused "" "-s -w" \
      github.com/kubeflow/mpi-operator/cmd/mpi-operator
    finish "$dir" mpi-operator ""
  fi
  echo "MPI_OPERATOR=$dir/mpi-operator"
}

# operator DIR-NAME MODULE VERSION BINARY PKG CRD...: builds one controller-runtime operator
# (no replace directives needed) and copies its CRDs (paths inside the module) to DIR/crds.
build_operator() {
  local name=$1 mod=$2 v=$3 bin=$4 pkg=$5; shift 5
  local dir=$PGS_CACHE/bin/$name-v$v-$GOV
  if ! built "$dir" "crds=$*" "$bin"; then
    begin "$name v$v"
    rm -rf "$dir"; mkdir -p "$dir/crds"
    wrapper_build "$dir" "$name" "$mod" "$v" unused "" "-s -w" "$pkg"
    [ -x "$dir/$bin" ] || mv "$dir/$(basename "$pkg")" "$dir/$bin"
    local src c; src=$(modjson "$mod@v$v" Dir)
    for c in "$@"; do cp "$src/$c" "$dir/crds/"; done
    chmod -R u+w "$dir"
    finish "$dir" "$name" "crds=$*"
  fi
  echo "$(echo "$name" | tr a-z- A-Z_)=$dir/$bin"
  echo "$(echo "$name" | tr a-z- A-Z_)_CRDS=$dir/crds"
}

build_jobset() {
  build_operator jobset sigs.k8s.io/jobset "$JOBSET_VERSION" jobset-controller sigs.k8s.io/jobset \
    config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml
}

build_lws() {
  build_operator lws sigs.k8s.io/lws "$LWS_VERSION" lws-controller sigs.k8s.io/lws/cmd \
    config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml \
    config/crd/bases/disaggregatedset.x-k8s.io_disaggregatedsets.yaml
}

build_kuberay() {
  build_operator kuberay github.com/ray-project/kuberay/ray-operator "$KUBERAY_VERSION" \
    ray-operator github.com/ray-project/kuberay/ray-operator \
    config/crd/bases/ray.io_rayclusters.yaml config/crd/bases/ray.io_rayjobs.yaml \
    config/crd/bases/ray.io_rayservices.yaml
}

build_trainer() {
  build_operator trainer github.com/kubeflow/trainer/v2 "$TRAINER_VERSION" trainer-controller-manager \
    github.com/kubeflow/trainer/v2/cmd/trainer-controller-manager \
    manifests/base/crds/trainer.kubeflow.org_trainjobs.yaml \
    manifests/base/crds/trainer.kubeflow.org_trainingruntimes.yaml \
    manifests/base/crds/trainer.kubeflow.org_clustertrainingruntimes.yaml
}

# Kueue: the controller manager and every CRD it serves (it watches them all at start).
build_kueue() {
  local v=$KUEUE_VERSION
  local dir=$PGS_CACHE/bin/kueue-v$v-$GOV
  if ! built "$dir" "crds=all" kueue; then
    begin "kueue v$v"
    rm -rf "$dir"; mkdir -p "$dir/crds"
    wrapper_build "$dir" kueue sigs.k8s.io/kueue "$v" unused "" "-s -w" sigs.k8s.io/kueue/cmd/kueue
    local src; src=$(modjson "sigs.k8s.io/kueue@v$v" Dir)
    cp "$src"/config/components/crd/bases/*.yaml "$dir/crds/"
    cp "$src/config/components/webhook/manifests.yaml" "$dir/webhooks.yaml"
    chmod -R u+w "$dir"
    finish "$dir" kueue "crds=all"
  fi
  echo "KUEUE=$dir/kueue"
  echo "KUEUE_CRDS=$dir/crds"
  echo "KUEUE_WEBHOOKS=$dir/webhooks.yaml"
}

[ $# -gt 0 ] || set -- kwok scheduler-plugins volcano training-operator mpi-operator jobset lws kuberay trainer kueue
for c in "$@"; do
  case $c in
    kwok) build_kwok ;;
    scheduler-plugins) build_scheduler_plugins ;;
    volcano) build_volcano ;;
    training-operator) build_training_operator ;;
    mpi-operator) build_mpi_operator ;;
    jobset) build_jobset ;;
    lws) build_lws ;;
    kuberay) build_kuberay ;;
    trainer) build_trainer ;;
    kueue) build_kueue ;;
    *) echo "get-e2e-binaries.sh: unknown component $c" >&2; exit 2 ;;
  esac
done

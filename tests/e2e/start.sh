#!/usr/bin/env bash
# Starts the end-to-end components next to a running test control plane (tests/cluster/start.sh):
#   kwok                          simulated nodes and pod lifecycle (stages below)
#   kube-controller-manager       a second one, with only the node-lifecycle, pod GC and StatefulSet
#                                 controllers (LeaderWorkerSets run their groups as StatefulSets)
#   scheduler-plugins scheduler   profile "default-scheduler" with Coscheduling
#   scheduler-plugins controller  fills the coscheduling PodGroups' status (phase, counts)
#   volcano controller-manager    only queue-controller (opens Queues) and pg-controller (PodGroups
#                                 for pods that carry no group-name, as in any Volcano install)
#   volcano scheduler             --scheduler-name=volcano, the upstream default configuration
#                                 plus the network-topology-aware plugin
#   training-operator v1          PyTorchJob and TFJob, gang scheduling off
#   mpi-operator v2               MPIJob v2beta1, gang scheduling off
#   JobSet controller             JobSets (SPEC §11), its webhooks registered on loopback
#   KubeRay operator              RayClusters and RayJobs, batch scheduler off
#   Trainer controller manager    Trainer v2's TrainJobs (run as JobSets), its webhooks registered
#                                 on loopback
#   Kueue controller manager      admission and preemption of jobs labelled with a LocalQueue
#                                 (SPEC §12): batch/v1 Jobs, PyTorchJobs, JobSets, RayJobs;
#                                 waitForPodsReady 40 s; its webhooks for those registered on
#                                 loopback
# Every process talks to the API server only, listens on loopback where it has a flag for it,
# and is listed in WORK_DIR/pids. Two listeners cannot be moved: the training-operator's webhook
# server (all interfaces, a free port) and the mpi-operator's health check (:8080, hardcoded).
#
# usage: start.sh WORK_DIR --kubeconfig KUBECONFIG [--owner-pid PID]
#
#   WORK_DIR         created if missing; receives *.log, the components' configuration, and:
#                      kubeconfig  a copy of KUBECONFIG (every process's argv names WORK_DIR,
#                                  which stop.sh relies on)
#                      env         shell-sourceable: E2E_DIR KUBECONFIG KWOK_NODE_ANNOTATION ...
#                      pids        one PID per line: exactly the processes this script started
#   --kubeconfig     an admin kubeconfig of the control plane
#   --owner-pid PID  also starts a detached reaper that runs stop.sh WORK_DIR as soon as PID exits
#
# environment:
#   READY_TIMEOUT=120       seconds each component may take to become ready
#   PGS_BIN_DIR             directory with kubectl (default: from tests/cluster/get-binaries.sh)
#   E2E_LOCK_TIMEOUT=3600   seconds to wait for another e2e run on this machine to finish
#   E2E_LOCK=/tmp/podgroup-sync-e2e.lock
#   KUEUE_PODS_READY_TIMEOUT=40  seconds of Kueue's waitForPodsReady timeout
#   E2E_NATIVE=1            Kubernetes' own gang scheduling instead of the two schedulers: the
#                           control plane's kube-scheduler (1.37, GenericWorkload and
#                           TopologyAwareWorkloadScheduling gates on) as "default-scheduler"; no
#                           scheduler-plugins, no Volcano (the control plane must be a
#                           NATIVE_GANG=1 one, with TOPOLOGY_GATE=1 for topology to be kept)
#
# One e2e environment per machine: the mpi-operator's health port (:8080) and the
# training-operator's certificate check (/tmp/k8s-webhook-server/serving-certs/tls.crt) are
# machine-global. A second run waits on E2E_LOCK; the lock is held by the started processes
# themselves (an inherited descriptor), so it is released when the last of them exits.
#
# Progress goes to stderr; on success the last stdout line is E2E_DIR=WORK_DIR. On failure every
# process started so far is stopped and the failing component's log tail is printed.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SCRIPT="e2e start.sh"
# shellcheck source=../lib.sh
. "$HERE/../lib.sh"
T0=${EPOCHREALTIME/./}
elapsed() { local us=$(( ${EPOCHREALTIME/./} - T0 )); printf '%d.%d' $(( us / 1000000 )) $(( us / 100000 % 10 )); }
log() { printf '[e2e-start %s +%ss] %s\n' "$(date +%H:%M:%S)" "$(elapsed)" "$*" >&2; }
usage() { echo "usage: $0 WORK_DIR --kubeconfig KUBECONFIG [--owner-pid PID]" >&2; exit 2; }

[ $# -ge 1 ] || usage
W=$1; shift
OWNER= KC=
while [ $# -gt 0 ]; do
  case $1 in
    --owner-pid) [ $# -ge 2 ] || usage; OWNER=$2; shift 2 ;;
    --owner-pid=*) OWNER=${1#*=}; shift ;;
    --kubeconfig) [ $# -ge 2 ] || usage; KC=$2; shift 2 ;;
    --kubeconfig=*) KC=${1#*=}; shift ;;
    *) usage ;;
  esac
done
[ -n "$KC" ] && [ -f "$KC" ] || { echo "e2e start.sh: --kubeconfig FILE is required" >&2; usage; }
if [ -n "$OWNER" ] && ! [ -d "/proc/$OWNER" ]; then
  echo "e2e start.sh: owner PID $OWNER is not running" >&2; exit 2
fi
READY_TIMEOUT=${READY_TIMEOUT:-120}
E2E_NATIVE=${E2E_NATIVE:-0}
E2E_LOCK=${E2E_LOCK:-/tmp/podgroup-sync-e2e.lock}

mkdir -p "$W"
W=$(cd "$W" && pwd -P)
refuse_if_running
rm -f "$W/pids" "$W/env" "$W/reaper.pid" "$W/stop.lock"
cp "$KC" "$W/kubeconfig"; chmod 600 "$W/kubeconfig"
KC=$W/kubeconfig
list_self_until_started

# --- machine-wide lock (fd 8, inherited by every component and the reaper) ---------------------
exec 8>>"$E2E_LOCK"
if ! flock -n 8; then
  log "another e2e environment runs on this machine (lock $E2E_LOCK); waiting for it"
  flock -w "${E2E_LOCK_TIMEOUT:-3600}" 8 || fail lock "still locked after ${E2E_LOCK_TIMEOUT:-3600}s"
fi

# --- reaper -----------------------------------------------------------------------------------
[ -z "$OWNER" ] || start_reaper e2e-reaper "the e2e components"

# --- binaries ---------------------------------------------------------------------------------
log "get-e2e-binaries.sh (cold: tens of minutes; warm: a second)"
if [ "$E2E_NATIVE" = 1 ]; then
  COMPONENTS=(kwok training-operator mpi-operator jobset lws kuberay trainer kueue)
  NEEDED=(KWOK KWOK_STAGES TRAINING_OPERATOR MPI_OPERATOR JOBSET LWS LWS_CRDS KUBERAY KUBERAY_CRDS
          TRAINER TRAINER_CRDS KUEUE KUEUE_CRDS KUEUE_WEBHOOKS)
else
  COMPONENTS=(kwok scheduler-plugins volcano training-operator mpi-operator jobset lws kuberay
              trainer kueue)
  NEEDED=(KWOK KWOK_STAGES SCHEDULER_PLUGINS SCHEDULER_PLUGINS_CONTROLLER SCHEDULER_PLUGINS_CRDS
          VOLCANO_SCHEDULER VOLCANO_CONTROLLER_MANAGER VOLCANO_CRDS TRAINING_OPERATOR MPI_OPERATOR
          JOBSET LWS LWS_CRDS KUBERAY KUBERAY_CRDS TRAINER TRAINER_CRDS KUEUE KUEUE_CRDS
          KUEUE_WEBHOOKS)
fi
out=$("$HERE/get-e2e-binaries.sh" "${COMPONENTS[@]}" </dev/null) || fail binaries "get-e2e-binaries.sh failed"
eval "$(printf '%s\n' "$out" | grep -E '^[A-Z_]+=' | sed -E 's/^([A-Z_]+)=(.*)$/\1=\x27\2\x27/')"
for v in "${NEEDED[@]}"; do
  [ -n "${!v:-}" ] && [ -e "${!v}" ] || fail binaries "get-e2e-binaries.sh gave no usable $v"
done

# kubectl from the control plane's bin dir (the API server's version).
CP_BIN=${PGS_BIN_DIR:-}
if [ -z "$CP_BIN" ]; then
  CP_BIN=$("$HERE/../cluster/get-binaries.sh" </dev/null | sed -n 's/^BIN=//p' | tail -n 1) ||
    fail binaries "tests/cluster/get-binaries.sh failed"
fi
[ -x "$CP_BIN/kubectl" ] || fail binaries "no kubectl in $CP_BIN"
kubectl() { "$CP_BIN/kubectl" --kubeconfig="$KC" "$@"; }

# --- helpers ----------------------------------------------------------------------------------

# The operators' metrics servers are off ("0"; SPC_METRICS, TO_METRICS, RAY_METRICS, JS_METRICS
# are left unused): a port found free here can be taken before the operator binds it, and a
# controller that cannot bind its metrics port exits.
read -r KWOK_PORT NKCM_PORT SP_PORT SPC_METRICS SPC_PROBE VC_LISTEN VC_HEALTH VCM_LISTEN \
  VCM_HEALTH TO_METRICS TO_PROBE TO_WEBHOOK JS_WEBHOOK JS_METRICS JS_PROBE RAY_METRICS \
  RAY_PROBE LWS_WEBHOOK LWS_PROBE TR_WEBHOOK TR_PROBE KQ_WEBHOOK KQ_PROBE < <(free_ports 23)

# --- cluster objects the components need --------------------------------------------------------
if [ "$E2E_NATIVE" != 1 ]; then
  log "installing the e2e CRDs (Volcano's, ElasticQuota) and namespaces"
  apply_args=()
  for f in "$VOLCANO_CRDS"/*.yaml "$SCHEDULER_PLUGINS_CRDS"/*.yaml; do apply_args+=(-f "$f"); done
  kubectl apply --server-side --force-conflicts --field-manager=podgroup-sync-e2e "${apply_args[@]}" \
    >"$W/crds.log" 2>&1 || fail crds "kubectl apply of the CRDs failed"
  kubectl wait --for=condition=Established --timeout="${READY_TIMEOUT}s" "${apply_args[@]}" \
    >>"$W/crds.log" 2>&1 || fail crds "CRDs not Established"
fi
for ns in kubeflow mpi-operator; do
  kubectl create namespace "$ns" --dry-run=client -o yaml | kubectl apply -f - >>"$W/crds.log" 2>&1 ||
    fail crds "cannot create namespace $ns"
done

# --- kwok -------------------------------------------------------------------------------------
# The upstream stages (node-initialize, pod-ready, pod-complete for Job-owned pods but a JobSet's
# and those labelled e2e.podgroup-sync.io/keep-running, pod-delete)
# plus one of ours: a Running pod labelled e2e.podgroup-sync.io/succeed=true exits 0 after 2 s,
# so a test decides which replica of a training job finishes (and with it the job).
# A JobSet's pods are Job-owned too; they keep running (a test ends one with the succeed label),
# so the scenarios see a JobSet's gang Running rather than already Completed.
{
  for f in node-initialize pod-ready pod-complete pod-delete; do
    if [ "$f" = pod-complete ]; then
      python3 - "$KWOK_STAGES/$f.yaml" <<'PY'
import sys
text = open(sys.argv[1]).read()
anchor = "    - key: '.metadata.ownerReferences.[].kind'\n"
assert anchor in text, "kwok's pod-complete stage changed: " + sys.argv[1]
print(text.replace(anchor, "    - key: '.metadata.labels.[\"jobset.sigs.k8s.io/jobset-name\"]'\n"
                   "      operator: 'DoesNotExist'\n"
                   "    - key: '.metadata.labels.[\"e2e.podgroup-sync.io/keep-running\"]'\n"
                   "      operator: 'DoesNotExist'\n" + anchor), end="")
PY
    else
      cat "$KWOK_STAGES/$f.yaml"
    fi
    echo "---"
  done
  cat <<'EOF'
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: e2e-pod-succeed
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchLabels:
      e2e.podgroup-sync.io/succeed: "true"
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'DoesNotExist'
    - key: '.status.phase'
      operator: 'In'
      values: ['Running']
  delay:
    durationMilliseconds: 2000
  next:
    statusTemplate: |
      {{ $now := Now }}
      containerStatuses:
      {{ range .spec.containers }}
      - image: {{ .image | Quote }}
        name: {{ .name | Quote }}
        ready: false
        restartCount: 0
        started: false
        state:
          terminated:
            exitCode: 0
            finishedAt: {{ $now | Quote }}
            reason: Completed
            startedAt: {{ $now | Quote }}
      {{ end }}
      conditions:
      - lastTransitionTime: {{ $now | Quote }}
        status: "False"
        type: Ready
        reason: PodCompleted
      phase: Succeeded
EOF
} > "$W/kwok-stages.yaml"
log "kwok (server 127.0.0.1:$KWOK_PORT; manages nodes annotated kwok.x-k8s.io/node=fake)"
start kwok "$KWOK" --kubeconfig="$KC" --config="$W/kwok-stages.yaml" \
  --manage-all-nodes=false --manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake \
  --cidr=10.0.0.1/24 --node-ip=10.0.0.1 --server-address="127.0.0.1:$KWOK_PORT"
wait_ready kwok "$STARTED_PID" http_ok "http://127.0.0.1:$KWOK_PORT/healthz"

# --- node controllers -------------------------------------------------------------------------
# The API server taints every new Node node.kubernetes.io/not-ready:NoSchedule
# (TaintNodesByCondition); the node-lifecycle-controller removes the taint once the node is
# Ready (kwok renews the node leases). The control plane's KCM runs without it, so a second KCM
# runs just the node controllers (the pod GC also removes pods left on deleted nodes), and the
# StatefulSet controller: a LeaderWorkerSet's leaders and each group's workers are StatefulSets.
log "kube-controller-manager: node-lifecycle, pod-garbage-collector, statefulset (secure port 127.0.0.1:$NKCM_PORT)"
start node-kcm "$CP_BIN/kube-controller-manager" --kubeconfig="$KC" \
  --authentication-kubeconfig="$KC" --authorization-kubeconfig="$KC" \
  --bind-address=127.0.0.1 --secure-port="$NKCM_PORT" --cert-dir="$W/node-kcm-certs" \
  --leader-elect=false --controllers=node-lifecycle-controller,pod-garbage-collector-controller,statefulset-controller
wait_ready node-kcm "$STARTED_PID" https_ok "https://127.0.0.1:$NKCM_PORT/healthz"

if [ "$E2E_NATIVE" = 1 ]; then
  # --- kube-scheduler with Kubernetes' own gang scheduling ------------------------------------
  [ -x "$CP_BIN/kube-scheduler" ] || fail binaries "no kube-scheduler in $CP_BIN (K8S_SCHEDULER=1)"
  log "kube-scheduler, GangScheduling and TopologyPlacementGenerator in the default profile (secure port 127.0.0.1:$SP_PORT)"
  # As for scheduler-plugins below: new capacity is seen within ~15 s, not 5 minutes.
  start kube-scheduler "$CP_BIN/kube-scheduler" --kubeconfig="$KC" \
    --authentication-kubeconfig="$KC" --authorization-kubeconfig="$KC" \
    --bind-address=127.0.0.1 --secure-port="$SP_PORT" --cert-dir="$W/kube-scheduler-certs" \
    --leader-elect=false --feature-gates=GenericWorkload=true,TopologyAwareWorkloadScheduling=true \
    --pod-max-in-unschedulable-pods-duration=15s -v=2
  wait_ready kube-scheduler "$STARTED_PID" https_ok "https://127.0.0.1:$SP_PORT/healthz"
else
# --- scheduler-plugins ------------------------------------------------------------------------
log "scheduler-plugins controller (probe 127.0.0.1:$SPC_PROBE)"
start sp-controller "$SCHEDULER_PLUGINS_CONTROLLER" --kubeconfig="$KC" \
  --metricsAddr=0 --probeAddr="127.0.0.1:$SPC_PROBE" \
  --enableLeaderElection=false
wait_ready sp-controller "$STARTED_PID" http_ok "http://127.0.0.1:$SPC_PROBE/readyz"

cat > "$W/sp-scheduler.yaml" <<EOF
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
leaderElection:
  leaderElect: false
clientConnection:
  kubeconfig: "$KC"
profiles:
- schedulerName: default-scheduler
  plugins:
    multiPoint:
      enabled:
      - name: Coscheduling
    queueSort:
      enabled:
      - name: Coscheduling
      disabled:
      - name: "*"
  pluginConfig:
  - name: Coscheduling
    args:
      permitWaitingTimeSeconds: 10
EOF
log "scheduler-plugins scheduler (secure port 127.0.0.1:$SP_PORT)"
# Coscheduling requeues a gang it rejected only on Pod or PodGroup events, not when a Node is
# added, so after new capacity appears the gang waits for the unschedulable-pods timeout
# (default 5 minutes); lowered here so that tests see new capacity within ~45 s.
start sp-scheduler "$SCHEDULER_PLUGINS" --config="$W/sp-scheduler.yaml" \
  --bind-address=127.0.0.1 --secure-port="$SP_PORT" --cert-dir="$W/sp-scheduler-certs" \
  --authentication-kubeconfig="$KC" --authorization-kubeconfig="$KC" \
  --pod-max-in-unschedulable-pods-duration=15s -v=2
wait_ready sp-scheduler "$STARTED_PID" https_ok "https://127.0.0.1:$SP_PORT/healthz"

# --- volcano ----------------------------------------------------------------------------------
log "volcano controller-manager: queue-controller, pg-controller (healthz 127.0.0.1:$VCM_HEALTH)"
start vc-controller-manager "$VOLCANO_CONTROLLER_MANAGER" --kubeconfig="$KC" \
  --controllers=queue-controller,pg-controller --scheduler-name=volcano --leader-elect=false \
  --enable-healthz=true --healthz-address="127.0.0.1:$VCM_HEALTH" \
  --listen-address="127.0.0.1:$VCM_LISTEN" -v=2
wait_ready vc-controller-manager "$STARTED_PID" http_ok "http://127.0.0.1:$VCM_HEALTH/healthz"

log "volcano scheduler (healthz 127.0.0.1:$VC_HEALTH)"
# The upstream default configuration plus network-topology-aware, as Volcano's guide to
# network-topology-aware scheduling has it (SPEC §13: HyperNode-level placement of gangs and of
# their sub-groups; the tiers are HyperNodes the scenarios create). Its HyperNode bin packing of
# pods without a topology is off, so that a job without one spreads (nodeorder) and the
# scenarios' control run shows what the topology changes.
cat > "$W/vc-scheduler.conf" <<'VCCONF'
actions: "enqueue, allocate, backfill"
tiers:
- plugins:
  - name: priority
  - name: gang
  - name: conformance
- plugins:
  - name: overcommit
  - name: drf
  - name: predicates
  - name: proportion
  - name: nodeorder
  - name: network-topology-aware
    arguments:
      weight: 10
      hypernode.binpack.normal-pod.enable: false
VCCONF
start vc-scheduler "$VOLCANO_SCHEDULER" --kubeconfig="$KC" --scheduler-name=volcano \
  --scheduler-conf="$W/vc-scheduler.conf" \
  --leader-elect=false --enable-healthz=true --healthz-address="127.0.0.1:$VC_HEALTH" \
  --listen-address="127.0.0.1:$VC_LISTEN" --cache-dumper=false -v=2
wait_ready vc-scheduler "$STARTED_PID" http_ok "http://127.0.0.1:$VC_HEALTH/healthz"
# The scheduler creates the default Queue; the queue-controller opens it.
queue_open() { [ "$(kubectl get queues.scheduling.volcano.sh default -o jsonpath='{.status.state}')" = Open ]; }
wait_ready vc-scheduler "$STARTED_PID" queue_open
log "volcano queue 'default' is Open"
fi

# --- training-operator ------------------------------------------------------------------------
# Gang scheduling off: no --gang-scheduler-name. Its client's 20 requests/s and one worker
# thread (the defaults) would set the pace of the Kueue soak's 1,000 jobs: raised. Its
# certificate rotator waits for
# /tmp/k8s-webhook-server/serving-certs/tls.crt (a constant; it only checks that the file
# exists), while its webhook server loads tls.crt/tls.key from $TMPDIR/k8s-webhook-server/
# serving-certs. So TMPDIR points into WORK_DIR, where a throw-away certificate is put, and the
# global path gets a copy only if it has no tls.crt yet (it is never removed or overwritten).
# No ValidatingWebhookConfiguration exists, so the API server never calls the webhook.
TO_TMP=$W/training-operator-tmp
CERTS=$TO_TMP/k8s-webhook-server/serving-certs
mkdir -p "$CERTS"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 7 \
  -subj /CN=training-operator.kubeflow.svc -addext subjectAltName=DNS:training-operator.kubeflow.svc \
  -keyout "$CERTS/tls.key" -out "$CERTS/tls.crt" >/dev/null 2>&1 || fail training-operator "openssl failed"
GLOBAL_CERTS=/tmp/k8s-webhook-server/serving-certs
if [ ! -e "$GLOBAL_CERTS/tls.crt" ]; then
  mkdir -p "$GLOBAL_CERTS"
  cp "$CERTS/tls.crt" "$GLOBAL_CERTS/.tls.crt.$$" && mv -n "$GLOBAL_CERTS/.tls.crt.$$" "$GLOBAL_CERTS/tls.crt"
  rm -f "$GLOBAL_CERTS/.tls.crt.$$"
fi
kubectl -n kubeflow create secret generic training-operator-webhook-cert --dry-run=client -o yaml |
  kubectl apply -f - >"$W/training-operator-setup.log" 2>&1 ||
  fail training-operator-setup "cannot create the webhook Secret"
log "training-operator (probe 127.0.0.1:$TO_PROBE, webhook :$TO_WEBHOOK)"
start training-operator env -u KUBECONFIG TMPDIR="$TO_TMP" MY_POD_NAMESPACE=kubeflow \
  "$TRAINING_OPERATOR" --kubeconfig="$KC" \
  --metrics-bind-address=0 --health-probe-bind-address="127.0.0.1:$TO_PROBE" \
  --webhook-server-port="$TO_WEBHOOK" --leader-elect=false \
  --enable-scheme=pytorchjob --enable-scheme=tfjob --enable-scheme=xgboostjob \
  --kube-api-qps=100 --kube-api-burst=200 --controller-threads=4
wait_ready training-operator "$STARTED_PID" http_ok "http://127.0.0.1:$TO_PROBE/readyz"

# --- mpi-operator -----------------------------------------------------------------------------
# Gang scheduling off: no --gang-scheduling. Its health check always listens on :8080.
if ! python3 -c 'import socket; s=socket.socket(); s.bind(("", 8080))' 2>/dev/null; then
  fail mpi-operator "port 8080 is in use (the mpi-operator's health check port is hardcoded): $(ss -ltnp 2>/dev/null | grep -w 8080 || true)"
fi
log "mpi-operator (health :8080, lock namespace mpi-operator)"
start mpi-operator env -u KUBECONFIG "$MPI_OPERATOR" --kubeConfig="$KC" \
  --lock-namespace=mpi-operator --threadiness=2
wait_ready mpi-operator "$STARTED_PID" http_ok "http://127.0.0.1:8080/healthz"
mpi_leading() { [ -n "$(kubectl -n mpi-operator get lease mpi-operator -o jsonpath='{.spec.holderIdentity}')" ]; }
wait_ready mpi-operator "$STARTED_PID" mpi_leading

# --- JobSet controller ------------------------------------------------------------------------
# Its webhooks default and validate JobSets (the controller dereferences the defaults) and
# mutate their pods; they are served on loopback with a certificate of a CA made here, and
# registered as the upstream manifests register them (failurePolicy Fail), with URLs.
OP_CERTS=$W/operator-certs
mkdir -p "$OP_CERTS"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 7 -subj /CN=e2e-operators-ca \
  -keyout "$OP_CERTS/ca.key" -out "$OP_CERTS/ca.crt" >/dev/null 2>&1 || fail jobset "openssl failed"
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj /CN=127.0.0.1 \
  -keyout "$OP_CERTS/tls.key" -out "$OP_CERTS/tls.csr" >/dev/null 2>&1 || fail jobset "openssl failed"
printf 'subjectAltName=IP:127.0.0.1\n' > "$OP_CERTS/san.ext"
openssl x509 -req -in "$OP_CERTS/tls.csr" -CA "$OP_CERTS/ca.crt" -CAkey "$OP_CERTS/ca.key" \
  -CAcreateserial -days 7 -extfile "$OP_CERTS/san.ext" -out "$OP_CERTS/tls.crt" >/dev/null 2>&1 ||
  fail jobset "openssl failed"
# Metrics off, as for LWS, Trainer and Kueue: no test reads them, and a port found free can be
# taken before the manager binds it — the JobSet controller then exits after its readyz passed
# (seen once in CI beside the faults tier, failing every JobSet and TrainJob scenario).
cat > "$W/jobset-config.yaml" <<EOF
apiVersion: config.jobset.x-k8s.io/v1alpha1
kind: Configuration
internalCertManagement: {enable: false}
leaderElection: {leaderElect: false}
webhook: {port: $JS_WEBHOOK, host: 127.0.0.1, certDir: $OP_CERTS}
metrics: {bindAddress: "0"}
health: {healthProbeBindAddress: "127.0.0.1:$JS_PROBE"}
EOF
log "jobset controller (probe 127.0.0.1:$JS_PROBE, webhook 127.0.0.1:$JS_WEBHOOK)"
start jobset env -u KUBECONFIG "$JOBSET" --kubeconfig="$KC" --config="$W/jobset-config.yaml"
wait_ready jobset "$STARTED_PID" http_ok "http://127.0.0.1:$JS_PROBE/readyz"
python3 "$HERE/operator-webhooks.py" jobset "$JS_WEBHOOK" "$OP_CERTS/ca.crt" > "$W/jobset-webhooks.json" ||
  fail jobset-setup "cannot write the JobSet webhook configurations"
kubectl apply -f "$W/jobset-webhooks.json" >"$W/jobset-setup.log" 2>&1 ||
  fail jobset-setup "cannot register the JobSet webhooks"

# --- LeaderWorkerSet controller ---------------------------------------------------------------
# Gang scheduling off (no gangSchedulingManagement): podgroup-sync makes the PodGroups. Its
# webhooks default and validate LWSs and label their pods (a leader's group-index); served on
# loopback with the JobSet controller's certificate, registered as upstream registers them. It
# also runs the DisaggregatedSet controller, whose CRD the control plane does not install.
kubectl apply --server-side --field-manager=podgroup-sync-e2e \
  -f "$LWS_CRDS/disaggregatedset.x-k8s.io_disaggregatedsets.yaml" >"$W/lws-setup.log" 2>&1 ||
  fail lws-setup "kubectl apply of the DisaggregatedSet CRD failed"
cat > "$W/lws-config.yaml" <<EOF
apiVersion: config.lws.x-k8s.io/v1alpha1
kind: Configuration
internalCertManagement: {enable: false}
leaderElection: {leaderElect: false}
webhook: {port: $LWS_WEBHOOK, host: 127.0.0.1, certDir: $OP_CERTS}
metrics: {bindAddress: "0"}
health: {healthProbeBindAddress: "127.0.0.1:$LWS_PROBE"}
EOF
log "lws controller (probe 127.0.0.1:$LWS_PROBE, webhook 127.0.0.1:$LWS_WEBHOOK)"
start lws env -u KUBECONFIG "$LWS" --kubeconfig="$KC" --config="$W/lws-config.yaml"
wait_ready lws "$STARTED_PID" http_ok "http://127.0.0.1:$LWS_PROBE/readyz"
python3 "$HERE/operator-webhooks.py" lws "$LWS_WEBHOOK" "$OP_CERTS/ca.crt" > "$W/lws-webhooks.json" ||
  fail lws-setup "cannot write the LeaderWorkerSet webhook configurations"
kubectl apply -f "$W/lws-webhooks.json" >>"$W/lws-setup.log" 2>&1 ||
  fail lws-setup "cannot register the LeaderWorkerSet webhooks"

# --- KubeRay operator -------------------------------------------------------------------------
# Batch scheduler off (no --enable-batch-scheduler): podgroup-sync makes the PodGroups. It also
# watches RayServices, whose CRD the control plane does not install.
kubectl apply --server-side --field-manager=podgroup-sync-e2e -f "$KUBERAY_CRDS/ray.io_rayservices.yaml" \
  >"$W/kuberay-setup.log" 2>&1 || fail kuberay-setup "kubectl apply of the RayService CRD failed"
log "kuberay operator (probe 127.0.0.1:$RAY_PROBE)"
# --kubeconfig (controller-runtime's flag) rather than the variable: stop.sh finds a component by
# the work directory in its argv.
start kuberay env -u KUBECONFIG "$KUBERAY" --kubeconfig="$KC" --metrics-addr=0 \
  --health-probe-bind-address="127.0.0.1:$RAY_PROBE" --enable-leader-election=false
wait_ready kuberay "$STARTED_PID" http_ok "http://127.0.0.1:$RAY_PROBE/readyz"

# --- Trainer v2 controller manager -------------------------------------------------------------
# Gang scheduling is a runtime's choice (podGroupPolicy): a runtime without one leaves the
# TrainJob's JobSet to podgroup-sync. Its webhooks default and validate TrainJobs and runtimes;
# served on loopback with the JobSet controller's certificate, which controller-runtime reads from
# $TMPDIR/k8s-webhook-server/serving-certs (Trainer's configuration names no certificate
# directory). The control plane installs its CRDs with WORKLOAD_CRDS=1; applied here too, so the
# tier runs on a control plane started without them.
kubectl apply --server-side --force-conflicts --field-manager=podgroup-sync-e2e \
  -f "$TRAINER_CRDS" >"$W/trainer-setup.log" 2>&1 ||
  fail trainer-setup "kubectl apply of Trainer's CRDs failed"
TR_CERTS=$W/trainer-tmp/k8s-webhook-server/serving-certs
mkdir -p "$TR_CERTS"
cp "$OP_CERTS/tls.crt" "$OP_CERTS/tls.key" "$TR_CERTS/"
cat > "$W/trainer-config.yaml" <<EOF
apiVersion: config.trainer.kubeflow.org/v1alpha1
kind: Configuration
leaderElection: {leaderElect: false}
certManagement: {enable: false}
webhook: {port: $TR_WEBHOOK, host: 127.0.0.1}
metrics: {bindAddress: "0"}
health: {healthProbeBindAddress: "127.0.0.1:$TR_PROBE", readinessEndpointName: readyz, livenessEndpointName: healthz}
EOF
log "trainer controller manager (probe 127.0.0.1:$TR_PROBE, webhook 127.0.0.1:$TR_WEBHOOK)"
start trainer env -u KUBECONFIG TMPDIR="$W/trainer-tmp" "$TRAINER" --kubeconfig="$KC" \
  --config="$W/trainer-config.yaml"
wait_ready trainer "$STARTED_PID" http_ok "http://127.0.0.1:$TR_PROBE/readyz"
python3 "$HERE/operator-webhooks.py" trainer "$TR_WEBHOOK" "$OP_CERTS/ca.crt" > "$W/trainer-webhooks.json" ||
  fail trainer-setup "cannot write the Trainer webhook configurations"
kubectl apply -f "$W/trainer-webhooks.json" >>"$W/trainer-setup.log" 2>&1 ||
  fail trainer-setup "cannot register the Trainer webhooks"

# --- Kueue controller manager ------------------------------------------------------------------
# SPEC §12. Only jobs labelled kueue.x-k8s.io/queue-name are Kueue's (manageJobsWithoutQueueName
# off), so the other scenarios are untouched. waitForPodsReady evicts an admitted job whose pods
# are not all ready within 40 s (the controller is told with --kueue-pods-ready-timeout-seconds);
# a job evicted that way is not requeued (backoffLimitCount 0), so its scenario sees it stay
# suspended. Its webhooks (suspending a queued job at creation, defaulting and validating Kueue's
# own objects) are the upstream manifest's for the integrations enabled, served on loopback with
# the operators' certificate.
kubectl create namespace kueue-system --dry-run=client -o yaml | kubectl apply -f - \
  >"$W/kueue-setup.log" 2>&1 || fail kueue-setup "cannot create namespace kueue-system"
kubectl apply --server-side --force-conflicts --field-manager=podgroup-sync-e2e -f "$KUEUE_CRDS" \
  >>"$W/kueue-setup.log" 2>&1 || fail kueue-setup "kubectl apply of Kueue's CRDs failed"
kubectl wait --for=condition=Established --timeout="${READY_TIMEOUT}s" -f "$KUEUE_CRDS" \
  >>"$W/kueue-setup.log" 2>&1 || fail kueue-setup "Kueue's CRDs not Established"
# With its own certificate management off, Kueue loads a metrics serving certificate from a
# constant path, /etc/kueue/metrics/certs, even with its metrics server off (bindAddress "0"),
# and exits when there is none. As for the training-operator's constant path above, a throw-away
# certificate is put there only if it has no tls.crt yet (never removed or overwritten).
KQ_METRICS_CERTS=/etc/kueue/metrics/certs
if [ ! -e "$KQ_METRICS_CERTS/tls.crt" ]; then
  mkdir -p "$KQ_METRICS_CERTS" || fail kueue-setup "cannot create $KQ_METRICS_CERTS (run as root)"
  cp "$OP_CERTS/tls.key" "$KQ_METRICS_CERTS/.tls.key.$$" && mv -n "$KQ_METRICS_CERTS/.tls.key.$$" "$KQ_METRICS_CERTS/tls.key"
  cp "$OP_CERTS/tls.crt" "$KQ_METRICS_CERTS/.tls.crt.$$" && mv -n "$KQ_METRICS_CERTS/.tls.crt.$$" "$KQ_METRICS_CERTS/tls.crt"
  rm -f "$KQ_METRICS_CERTS/.tls.key.$$" "$KQ_METRICS_CERTS/.tls.crt.$$"
fi
cat > "$W/kueue-config.yaml" <<EOF
apiVersion: config.kueue.x-k8s.io/v1beta2
kind: Configuration
namespace: kueue-system
health: {healthProbeBindAddress: "127.0.0.1:$KQ_PROBE"}
metrics: {bindAddress: "0"}
webhook: {port: $KQ_WEBHOOK, host: 127.0.0.1, certDir: $OP_CERTS}
leaderElection: {leaderElect: false}
internalCertManagement: {enable: false}
# Kueue's client defaults to 20 requests/s (its chart: 50): at the soak's 1,000 jobs
# (bench/Makefile.inc: bench-kueue) that, not admission, would set the pace.
clientConnection: {qps: 200, burst: 400}
waitForPodsReady:
  timeout: ${KUEUE_PODS_READY_TIMEOUT:-40}s
  blockAdmission: false
  requeuingStrategy: {timestamp: Eviction, backoffLimitCount: 0}
integrations:
  frameworks: [batch/job, kubeflow.org/pytorchjob, jobset.x-k8s.io/jobset, ray.io/rayjob]
EOF
log "kueue controller manager (probe 127.0.0.1:$KQ_PROBE, webhook 127.0.0.1:$KQ_WEBHOOK)"
# The visibility API server (on by default) would serve a fixed port (8082) with a certificate
# from a constant path (/visibility): off.
start kueue env -u KUBECONFIG "$KUEUE" --kubeconfig="$KC" --config="$W/kueue-config.yaml" \
  --feature-gates=VisibilityOnDemand=false
wait_ready kueue "$STARTED_PID" http_ok "http://127.0.0.1:$KQ_PROBE/readyz"
python3 "$HERE/operator-webhooks.py" kueue "$KQ_WEBHOOK" "$OP_CERTS/ca.crt" "$KUEUE_WEBHOOKS" \
  > "$W/kueue-webhooks.json" || fail kueue-setup "cannot write the Kueue webhook configurations"
kubectl apply -f "$W/kueue-webhooks.json" >>"$W/kueue-setup.log" 2>&1 ||
  fail kueue-setup "cannot register the Kueue webhooks"

{
  printf 'export E2E_DIR=%q\n' "$W"
  printf 'export KUBECONFIG=%q\n' "$KC"
  printf 'export KWOK_NODE_ANNOTATION=%q\n' "kwok.x-k8s.io/node=fake"
  printf 'export KWOK_SUCCEED_LABEL=%q\n' "e2e.podgroup-sync.io/succeed=true"
  printf 'export SP_SCHEDULER_NAME=%q\n' "default-scheduler"
  printf 'export VOLCANO_SCHEDULER_NAME=%q\n' "volcano"
} > "$W/env"

STARTED_OK=1
log "e2e components ready in $W (stop: $HERE/stop.sh $W)"
echo "E2E_DIR=$W"

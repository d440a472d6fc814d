# podgroup-sync — the commands of the README.
#   make test   everything CI checks: formatting, clippy, unit tests, and the integration tests
#               on a real control plane (built from the Go module proxy on first use)
#   make demo   a local control plane, the controller, the sample jobs and their PodGroups
#   make bench  the scale benchmark (bench/Makefile.inc)
#   make faults the fault tier: API server, etcd and controller killed and restarted, a forced
#               watch expiry and 429 throttling, each mid-burst on a control plane of its own
#   make native the native-backend tier: the control-plane tests and the end-to-end scenarios on
#               Kubernetes 1.37 with the GenericWorkload gate (kube-scheduler's own gang
#               scheduling), built from the Go proxy like the 1.34 binaries
#   make install the binary and the kubectl plugin's link to it into $(PREFIX)/bin (default
#               /usr/local): `kubectl podgroup-sync status NS/JOB` then works
#   make image  the container image for linux/amd64 and linux/arm64 as one OCI archive
#               (target/image/), no registry needed, with an SPDX SBOM beside it
#   make node   the node tier: the image and the chart run by a real kubelet (containerd, runc,
#               CNI from Debian; kubelet, kube-proxy, kube-scheduler from the Go proxy) inside a
#               network namespace of its own
#   make e2e    the end-to-end tier: kwok nodes, the scheduler-plugins and Volcano schedulers,
#               training-operator and mpi-operator (gang mode off), the JobSet controller, the
#               LeaderWorkerSet controller, the KubeRay operator, the Trainer v2 controller and
#               Kueue, all built from the Go proxy
.PHONY: test lint unit integration binaries faults e2e native node image demo build release install

CARGO ?= cargo

test: lint binaries
	$(CARGO) test --all-targets

lint:
	$(CARGO) fmt --check
	$(CARGO) clippy --all-targets -- -D warnings
	$(CARGO) clippy --test e2e --test faults --test doors --test native --test e2e_native --test node -- -D warnings

unit:
	$(CARGO) test --lib

# The control-plane binaries and CRDs (idempotent; cached under ~/.cache/podgroup-sync).
binaries:
	tests/cluster/get-binaries.sh >/dev/null

integration: binaries
	$(CARGO) test --tests

# One scenario at a time: each kills processes of a control plane of its own.
faults: binaries
	$(CARGO) test --test faults --test doors -- --test-threads=1 --nocapture

e2e: binaries
	tests/e2e/get-e2e-binaries.sh >/dev/null
	$(CARGO) test --test e2e

# The 1.37 control plane of the native-backend tier, then its tests.
native:
	K8S_VERSION=1.37.2 K8S_SCHEDULER=1 tests/cluster/get-binaries.sh >/dev/null
	tests/e2e/get-e2e-binaries.sh kwok training-operator mpi-operator jobset lws kuberay trainer kueue >/dev/null
	$(CARGO) test --test native --test e2e_native

# The image (hack/image.sh): a static release binary on an empty base, user 65532.
image:
	hack/image.sh

# Everything is built first (helm too: the namespace has no route to the Go module proxy); then
# the tests run inside tests/node/netns.sh's namespace.
node: binaries image
	tests/node/get-node.sh >/dev/null
	tests/node/get-previous.sh >/dev/null
	tests/cluster/get-helm.sh >/dev/null
	$(CARGO) test --test node --no-run
	tests/node/netns.sh $(CARGO) test --test node -- --test-threads=1 --nocapture

build:
	$(CARGO) build

release:
	$(CARGO) build --release --locked

# The binary, and kubectl's plugin: a link named as kubectl's convention wants, beside it.
PREFIX ?= /usr/local
install:
	$(CARGO) install --locked --path . --root $(DESTDIR)$(PREFIX) --bin podgroup-sync
	ln -sf podgroup-sync $(DESTDIR)$(PREFIX)/bin/kubectl-podgroup_sync

demo: binaries
	hack/demo.sh

# make bench, make bench-smoke (the scale benchmark of issue 7)
include bench/Makefile.inc

//! The node tier (`make node`): the container image `make image` builds, installed with the Helm
//! chart and run by a real kubelet (containerd, runc and the CNI bridge from Debian; kubelet,
//! kube-proxy and kube-scheduler of the control plane's version), all inside the network
//! namespace of `tests/node/netns.sh`. Nothing is pulled: the image and the pause image are
//! imported from OCI archives.
//!
//! The chart is installed with the values a user sets for a local image (`image.tag`,
//! `image.pullPolicy=Never`) and `replicas=2`; nothing else. Loopback networking needs nothing
//! from the chart: kube-proxy routes the `kubernetes` Service to the API server's address in the
//! namespace, so the pods use the in-cluster configuration as in any cluster.
//!
//! Run only through `make node` (it builds the image and enters the namespace); outside it every
//! test fails, saying so.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, ResourceExt};
use serde_json::{Value, json};

use support::chart::{chart_dir, helm_stderr, run_helm};
use support::controller::{http_get, metric_sum};
use support::jobs::{self, Backend, KINDS};
use support::lifecycle::Gang;
use support::webhook::{dry_run_create, link_of, operator_pod, unlinked};
use support::{Cluster, stdout_of, wait_for};

/// What `tests/node/start.sh` started next to the control plane.
struct Node {
    cluster: Cluster,
    /// tests/node/start.sh's work directory.
    dir: PathBuf,
    /// containerd's socket (to find a container's process).
    containerd_sock: PathBuf,
}

/// The OCI archive `make image` built (PGS_IMAGE, or the default path of hack/image.sh).
fn image_archive() -> PathBuf {
    std::env::var_os("PGS_IMAGE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR")).join(format!(
                "target/image/podgroup-sync-{}.oci.tar",
                env!("CARGO_PKG_VERSION")
            ))
        })
}

const IMAGE_REPOSITORY: &str = "podgroup-sync";

/// The control plane and the node, started once per test binary and stopped (by their reapers)
/// when it exits.
fn node() -> &'static Node {
    static NODE: OnceLock<Result<Node, String>> = OnceLock::new();
    match NODE.get_or_init(start_node) {
        Ok(node) => node,
        Err(message) => panic!("{message}"),
    }
}

fn start_node() -> Result<Node, String> {
    let node_ip = std::env::var("NODE_IP")
        .map_err(|_| "NODE_IP is not set: run the node tier with `make node`".to_string())?;
    let archive = image_archive();
    if !archive.is_file() {
        return Err(format!(
            "{} is missing: `make node` builds it (make image)",
            archive.display()
        ));
    }
    let cluster = support::private_cluster_with(&[("NODE_IP", &node_ip)]);
    let work = cluster
        .work_dir
        .clone()
        .expect("a private control plane")
        .join("node");
    let mut command =
        Command::new(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/node/start.sh"));
    command
        .arg(&work)
        .arg("--kubeconfig")
        .arg(&cluster.kubeconfig)
        .arg("--image")
        .arg(format!(
            "{}=docker.io/library/{IMAGE_REPOSITORY}",
            archive.display()
        ))
        // The previous release's image, which the upgrade starts from (same repository, its own
        // tag).
        .arg("--image")
        .arg(format!(
            "{}=docker.io/library/{IMAGE_REPOSITORY}",
            previous_release().image
        ))
        .arg("--owner-pid")
        .arg(std::process::id().to_string());
    support::run_start_script(command)
        .map_err(|(what, tail)| format!("the node could not start: {what}\n{tail}"))?;
    Ok(Node {
        cluster,
        containerd_sock: work.join("containerd.sock"),
        dir: work,
    })
}

// --- the image --------------------------------------------------------------------------------

/// A file of the OCI archive, by path inside it.
fn archive_file(archive: &Path, path: &str) -> Vec<u8> {
    stdout_of(Command::new("tar").arg("-xOf").arg(archive).arg(path))
}

fn blob(archive: &Path, digest: &str) -> Vec<u8> {
    archive_file(
        archive,
        &format!("./blobs/sha256/{}", digest.trim_start_matches("sha256:")),
    )
}

/// The final stage's instruction `word` of the Dockerfile (e.g. USER), as written.
fn dockerfile_final(word: &str) -> Vec<String> {
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("Dockerfile"))
        .expect("read the Dockerfile");
    let lines: Vec<&str> = text.lines().collect();
    let last_from = lines
        .iter()
        .rposition(|l| l.starts_with("FROM "))
        .expect("a FROM");
    lines[last_from..]
        .iter()
        .filter_map(|l| l.strip_prefix(&format!("{word} ")))
        .map(str::to_string)
        .collect()
}

#[test]
fn the_image_is_the_dockerfiles_layout_static_and_non_root_for_both_architectures() {
    let archive = image_archive();
    assert!(
        archive.is_file(),
        "{} is missing: run `make image`",
        archive.display()
    );
    // index.json names the tag; its one entry is the image index of the two platforms.
    let top: Value = serde_json::from_slice(&archive_file(&archive, "./index.json")).unwrap();
    let entries = top["manifests"].as_array().unwrap();
    assert_eq!(entries.len(), 1, "{top}");
    assert_eq!(
        entries[0]["annotations"]["org.opencontainers.image.ref.name"],
        env!("CARGO_PKG_VERSION")
    );
    assert_eq!(
        entries[0]["mediaType"],
        "application/vnd.oci.image.index.v1+json"
    );
    let index: Value =
        serde_json::from_slice(&blob(&archive, entries[0]["digest"].as_str().unwrap())).unwrap();
    let platforms: Vec<&str> = index["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["platform"]["architecture"].as_str().unwrap())
        .collect();
    assert_eq!(platforms, ["amd64", "arm64"], "{index}");

    // The same user, entrypoint, command and binary path as the Dockerfile's final stage.
    assert_eq!(dockerfile_final("FROM"), vec!["scratch".to_string()]);
    let entrypoint: Value = serde_json::from_str(&dockerfile_final("ENTRYPOINT")[0]).unwrap();
    let cmd: Value = serde_json::from_str(&dockerfile_final("CMD")[0]).unwrap();
    assert_eq!(entrypoint, json!(["/usr/local/bin/podgroup-sync"]));
    assert!(
        dockerfile_final("COPY")
            .iter()
            .any(|l| l == "--from=build /out/ /usr/local/bin/"),
        "{:?}",
        dockerfile_final("COPY")
    );
    for m in index["manifests"].as_array().unwrap() {
        let arch = m["platform"]["architecture"].as_str().unwrap();
        assert_eq!(m["platform"]["os"], "linux");
        let manifest: Value =
            serde_json::from_slice(&blob(&archive, m["digest"].as_str().unwrap())).unwrap();
        let config: Value = serde_json::from_slice(&blob(
            &archive,
            manifest["config"]["digest"].as_str().unwrap(),
        ))
        .unwrap();
        assert_eq!(config["architecture"], arch, "{config}");
        let c = &config["config"];
        assert_eq!(
            dockerfile_final("USER"),
            vec![c["User"].as_str().unwrap().to_string()]
        );
        assert_eq!(
            c["User"], "65532:65532",
            "numeric, so runAsNonRoot can check it"
        );
        assert_eq!(c["Entrypoint"], entrypoint);
        assert_eq!(c["Cmd"], cmd);

        // One layer, holding the binary, the kubectl plugin's link to it and their directories
        // only: no shell, no libc, nothing to write to (a read-only root filesystem loses
        // nothing).
        let layers = manifest["layers"].as_array().unwrap();
        assert_eq!(layers.len(), 1, "{manifest}");
        let dir = tempdir(&format!("image-layer-{arch}"));
        let binary =
            only_the_static_binary(&archive, layers[0]["digest"].as_str().unwrap(), &dir, arch);
        eprintln!(
            "figure: image {arch}: compressed layer {:.1} MiB, binary {:.1} MiB",
            layers[0]["size"].as_u64().unwrap() as f64 / 1048576.0,
            std::fs::metadata(&binary).unwrap().len() as f64 / 1048576.0
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
    eprintln!(
        "figure: image archive {:.1} MiB (both architectures)",
        std::fs::metadata(&archive).unwrap().len() as f64 / 1048576.0
    );
    the_sbom_lists_the_crates_in_the_binary(&archive);
}

/// The SPDX SBOM beside the archive names the crate and its locked dependencies.
fn the_sbom_lists_the_crates_in_the_binary(archive: &Path) {
    let path = archive.to_str().unwrap().replace(".oci.tar", ".spdx.json");
    let sbom: Value = serde_json::from_slice(&std::fs::read(&path).expect("the SBOM")).unwrap();
    assert_eq!(sbom["spdxVersion"], "SPDX-2.3");
    let lock =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.lock")).unwrap();
    let packages = sbom["packages"].as_array().unwrap();
    for name in [
        "podgroup-sync",
        "kube-client",
        "tokio",
        "rustls",
        "ring",
        "prometheus",
    ] {
        let p = packages
            .iter()
            .find(|p| p["name"] == name)
            .unwrap_or_else(|| panic!("{name} is not in the SBOM"));
        let version = p["versionInfo"].as_str().unwrap();
        assert!(
            lock.contains(&format!("name = \"{name}\"\nversion = \"{version}\"")),
            "{name} {version}: not the locked version"
        );
        assert_eq!(
            p["externalRefs"][0]["referenceLocator"],
            format!("pkg:cargo/{name}@{version}")
        );
    }
    assert!(
        !packages.iter().any(|p| p["name"] == "proptest"),
        "a test-only crate is not in the binary"
    );
    eprintln!("figure: SBOM {path}: {} crates", packages.len());
}

/// Unpacks the layer `digest` into `dir`, asserts it holds only the podgroup-sync binary for
/// `arch`, the kubectl plugin's link to it (and their directories), statically linked and
/// runnable (arm64 under Debian's qemu-user-static); returns the binary's path.
fn only_the_static_binary(archive: &Path, digest: &str, dir: &Path, arch: &str) -> PathBuf {
    let layer = dir.join("layer.tar.gz");
    std::fs::write(&layer, blob(archive, digest)).unwrap();
    // tar fails unless the layer is a valid tar.gz.
    let listing = stdout_of(Command::new("tar").arg("-tzf").arg(&layer));
    let files: Vec<String> = String::from_utf8_lossy(&listing)
        .lines()
        .map(|l| {
            l.trim_start_matches("./")
                .trim_start_matches('/')
                .to_string()
        })
        .filter(|l| !l.is_empty())
        .collect();
    assert_eq!(
        files,
        [
            "usr/",
            "usr/local/",
            "usr/local/bin/",
            "usr/local/bin/kubectl-podgroup_sync",
            "usr/local/bin/podgroup-sync"
        ],
        "{files:?}"
    );
    stdout_of(
        Command::new("tar")
            .arg("-xzf")
            .arg(&layer)
            .arg("-C")
            .arg(dir),
    );
    let binary = dir.join("usr/local/bin/podgroup-sync");
    let link = dir.join("usr/local/bin/kubectl-podgroup_sync");
    assert_eq!(
        std::fs::read_link(&link).unwrap(),
        Path::new("podgroup-sync"),
        "the plugin is a link to the binary beside it"
    );
    let headers = stdout_of(Command::new("readelf").arg("-hl").arg(&binary));
    let headers = String::from_utf8_lossy(&headers);
    assert!(headers.contains("LOAD"), "an ELF executable: {headers}");
    let machine = match arch {
        "amd64" => "X86-64",
        _ => "AArch64",
    };
    assert!(headers.contains(machine), "{arch}: {headers}");
    assert!(
        !headers.contains("INTERP"),
        "statically linked (there is no loader in the image): {headers}"
    );
    let run = |exe: &Path, args: &[&str]| -> std::process::Output {
        let mut c = if arch == "amd64" {
            Command::new(exe)
        } else {
            let mut c = Command::new("qemu-aarch64-static");
            c.arg(exe);
            c
        };
        c.args(args)
            .output()
            .unwrap_or_else(|e| panic!("running the {arch} binary: {e}"))
    };
    let version = run(&binary, &["--version"]);
    assert!(
        String::from_utf8_lossy(&version.stdout).contains(env!("CARGO_PKG_VERSION")),
        "{arch}: {version:?}"
    );
    // Through the link: kubectl's plugin, which wants a subcommand.
    let plugin = run(&link, &["status", "--help"]);
    assert!(
        String::from_utf8_lossy(&plugin.stdout).contains("Usage: kubectl podgroup-sync status"),
        "{arch}: {plugin:?}"
    );
    binary
}

fn tempdir(what: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("podgroup-sync-{what}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

// --- the chart under the kubelet --------------------------------------------------------------

const RELEASE: &str = "pgs";
const RELEASE_NS: &str = "podgroup-sync-system";
const FULLNAME: &str = "pgs-podgroup-sync";
const WAIT: Duration = Duration::from_secs(120);

/// The previous release (tests/node/get-previous.sh, built by `make node`): its chart and tag.
struct Previous {
    image: String,
    chart: String,
    tag: String,
}

fn previous_release() -> Previous {
    let out = stdout_of(&mut Command::new(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/node/get-previous.sh"),
    ));
    let text = String::from_utf8_lossy(&out);
    let field = |k: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{k}=")))
            .unwrap_or_else(|| panic!("get-previous.sh printed no {k}: {text}"))
            .to_string()
    };
    Previous {
        image: field("PREVIOUS_IMAGE"),
        chart: field("PREVIOUS_CHART"),
        tag: field("PREVIOUS_TAG"),
    }
}

/// `helm install` or `helm upgrade` of the release with the values a user sets for a local
/// image, waiting until every pod is Ready (the kubelet's own readiness probes).
fn helm_release(cluster: &Cluster, verb: &str, chart: &str, tag: &str) {
    let out = run_helm(&[
        verb,
        RELEASE,
        chart,
        "--namespace",
        RELEASE_NS,
        "--create-namespace",
        "--kubeconfig",
        cluster.kubeconfig.to_str().unwrap(),
        "--set",
        &format!("image.tag={tag}"),
        "--set",
        "image.pullPolicy=Never",
        "--set",
        "replicas=2",
        "--wait",
        "--timeout=180s",
    ]);
    assert!(
        out.status.success(),
        "helm {verb} failed:\n{}\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        helm_stderr(&out),
        String::from_utf8_lossy(
            &cluster
                .kubectl(&["describe", "pods", "-n", RELEASE_NS])
                .stdout
        )
    );
}

async fn controller_pods(client: &kube::Client) -> Vec<Pod> {
    Api::<Pod>::namespaced(client.clone(), RELEASE_NS)
        .list(
            &ListParams::default().labels(
                "app.kubernetes.io/name=podgroup-sync,app.kubernetes.io/component=controller",
            ),
        )
        .await
        .expect("list the controller pods")
        .items
}

fn ready(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

async fn lease_holder(client: &kube::Client) -> Option<String> {
    let api: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(client.clone(), RELEASE_NS);
    api.get_opt(FULLNAME)
        .await
        .ok()
        .flatten()
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
}

fn first_container(pod: &Pod) -> &k8s_openapi::api::core::v1::ContainerStatus {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.first())
        .unwrap_or_else(|| panic!("{} has no container: {}", pod.name_any(), why_gone(pod)))
}

/// The pod's phase, reason and message: an eviction (the node short of disk, say) says so here.
fn why_gone(pod: &Pod) -> String {
    let s = pod.status.as_ref();
    format!(
        "phase {:?}, reason {:?}, message {:?}",
        s.and_then(|s| s.phase.as_deref()),
        s.and_then(|s| s.reason.as_deref()),
        s.and_then(|s| s.message.as_deref())
    )
}

/// The host PID of a pod's first container, from containerd's task list.
fn container_pid(node: &Node, pod: &Pod) -> u32 {
    let id = first_container(pod)
        .container_id
        .clone()
        .expect("a container ID");
    let id = id.trim_start_matches("containerd://");
    let out = Command::new("ctr")
        .arg("--address")
        .arg(&node.containerd_sock)
        .args(["--namespace", "k8s.io", "tasks", "ls"])
        .output()
        .expect("ctr tasks ls");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| {
            let mut f = l.split_whitespace();
            (f.next() == Some(id)).then(|| f.next().unwrap().parse().unwrap())
        })
        .unwrap_or_else(|| {
            panic!(
                "no containerd task {id} of {} (as listed just before: {}); an evicted pod says so in a new listing",
                pod.name_any(),
                why_gone(pod)
            )
        })
}

/// The chart's security context, as the kernel applies it to the running process.
fn assert_restricted(pid: u32) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name}:")))
            .map(|v| v.split_whitespace().collect::<Vec<_>>().join(" "))
            .unwrap_or_default()
    };
    assert_eq!(field("Uid"), "65532 65532 65532 65532", "runs as 65532");
    assert_eq!(field("Gid"), "65532 65532 65532 65532");
    assert_eq!(field("NoNewPrivs"), "1", "allowPrivilegeEscalation: false");
    assert_eq!(
        field("Seccomp"),
        "2",
        "seccomp RuntimeDefault (filter mode)"
    );
    assert_eq!(
        field("CapEff"),
        "0000000000000000",
        "capabilities: drop ALL"
    );
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap_or_default();
    assert!(exe.ends_with("usr/local/bin/podgroup-sync"), "{exe:?}");
    let mountinfo = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap();
    let root = mountinfo
        .lines()
        .find(|l| l.split_whitespace().nth(4) == Some("/"))
        .expect("a root mount");
    let options = root.split_whitespace().nth(5).unwrap();
    assert!(
        options.split(',').any(|o| o == "ro"),
        "readOnlyRootFilesystem: {root}"
    );
}

/// A GET through kube-proxy's Service IP and through every endpoint of the Service.
async fn scrape_through_the_service(client: &kube::Client) -> Vec<String> {
    let svc: k8s_openapi::api::core::v1::Service = Api::namespaced(client.clone(), RELEASE_NS)
        .get(&format!("{FULLNAME}-metrics"))
        .await
        .expect("the metrics Service");
    let spec = svc.spec.unwrap();
    let ip = spec.cluster_ip.unwrap();
    let port = spec.ports.unwrap()[0].port;
    let via_service = wait_for("/metrics through the Service IP", WAIT, || async {
        http_get(format!("{ip}:{port}").parse().unwrap(), "/metrics")
            .filter(|(code, body)| *code == 200 && body.contains("podgroup_sync_"))
    })
    .await;
    let slices: Api<k8s_openapi::api::discovery::v1::EndpointSlice> =
        Api::namespaced(client.clone(), RELEASE_NS);
    let endpoints = wait_for("two ready endpoints", WAIT, || async {
        let list = slices
            .list(
                &ListParams::default()
                    .labels(&format!("kubernetes.io/service-name={FULLNAME}-metrics")),
            )
            .await
            .ok()?;
        let (ips, port): (Vec<String>, Option<i32>) =
            list.items
                .iter()
                .fold((Vec::new(), None), |(mut ips, port), s| {
                    for e in &s.endpoints {
                        if e.conditions.as_ref().and_then(|c| c.ready) == Some(true) {
                            ips.extend(e.addresses.iter().cloned());
                        }
                    }
                    let p = s.ports.as_ref().and_then(|p| p[0].port);
                    (ips, port.or(p))
                });
        (ips.len() == 2).then(|| {
            ips.into_iter()
                .map(|i| format!("{i}:{}", port.unwrap()))
                .collect::<Vec<_>>()
        })
    })
    .await;
    let mut bodies = vec![via_service.1];
    for e in endpoints {
        let (code, body) = http_get(e.parse().unwrap(), "/metrics").expect("GET an endpoint");
        assert_eq!(code, 200, "{e}");
        bodies.push(body);
    }
    bodies
}

fn pod_logs(cluster: &Cluster, pod: &str) -> String {
    String::from_utf8_lossy(
        &cluster
            .kubectl(&["logs", "-n", RELEASE_NS, pod, "--tail=40"])
            .stdout,
    )
    .into_owned()
}

#[tokio::test]
async fn the_chart_runs_under_the_kubelet_with_the_in_cluster_configuration() {
    let node = node();
    let cluster = &node.cluster;
    let client = cluster.client().await;
    // The previous release first, with jobs; upgraded to this one with them running, rolled
    // back, and upgraded again.
    let previous = previous_release();
    let current_chart = chart_dir().display().to_string();
    let current_tag = env!("CARGO_PKG_VERSION");
    let started = Instant::now();
    helm_release(cluster, "install", &previous.chart, &previous.tag);
    eprintln!(
        "figure: helm install --wait of the previous release {}: both pods Ready after {:.1} s",
        previous.tag,
        started.elapsed().as_secs_f64()
    );
    // A replica of the previous release stops without draining its webhook: a pod created as
    // it exits can be admitted unlinked (seen: 1 in about 30 creates in 2 of 4 upgrades from it),
    // which nothing in this release can change. Where this release's replicas stop (the
    // rollback, a rolling restart), every pod must be linked.
    let upgrades = Upgrades::start(cluster, &client).await;
    upgrades
        .across("upgrade", Stopping::Previous, || {
            helm_release(cluster, "upgrade", &current_chart, current_tag)
        })
        .await;
    upgrades
        .across("rollback", Stopping::This, || helm_rollback(cluster, 1))
        .await;
    upgrades
        .across("upgrade again", Stopping::Previous, || {
            helm_release(cluster, "upgrade", &current_chart, current_tag)
        })
        .await;
    upgrades
        .across("rolling restart", Stopping::This, || {
            cluster.kubectl_ok(&[
                "rollout",
                "restart",
                "deployment",
                "-n",
                RELEASE_NS,
                FULLNAME,
            ]);
            cluster.kubectl_ok(&[
                "rollout",
                "status",
                "deployment",
                "-n",
                RELEASE_NS,
                FULLNAME,
                "--timeout=180s",
            ]);
        })
        .await;
    helm_test(cluster).await;

    // Running and Ready through the kubelet's probes, under the chart's security context.
    let pods = controller_pods(&client).await;
    assert_eq!(pods.len(), 2);
    for pod in &pods {
        assert!(ready(pod), "{}: not Ready", pod.name_any());
        assert_restricted(container_pid(node, pod));
    }

    // Two replicas, one leader; the leader's /metrics says so, the other's does not.
    let leader = wait_for("a leader", WAIT, || lease_holder(&client)).await;
    assert!(pods.iter().any(|p| p.name_any() == leader), "{leader}");
    let bodies = scrape_through_the_service(&client).await;
    let leaders: f64 = bodies[1..]
        .iter()
        .map(|b| metric_sum(b, "podgroup_sync_leader", &[]))
        .sum();
    assert_eq!(leaders, 1.0, "exactly one endpoint leads");

    jobs_of_every_kind_and_the_webhook(&client, cluster, &leader).await;

    // Nothing restarted meanwhile: the liveness probe held, the process never exited.
    for pod in controller_pods(&client).await {
        let restarts = first_container(&pod).restart_count;
        assert_eq!(restarts, 0, "{} restarted", pod.name_any());
    }

    leader_pod_deleted_hands_over(&client, &leader).await;
    stopping_the_node_leaves_nothing_behind(node);
}

// --- upgrades and rollbacks with jobs running --------------------------------------------------

/// Jobs whose PodGroups the release keeps, and the pod the watcher creates through the webhook.
struct Upgrades<'a> {
    cluster: &'static Cluster,
    client: &'a kube::Client,
    ns: String,
    jobs: Vec<(jobs::Kind, Backend, String)>,
    pod: Pod,
}

/// Whose replicas stop during a change: the previous release's (no webhook drain) or this one's.
#[derive(Clone, Copy, PartialEq)]
enum Stopping {
    Previous,
    This,
}

/// What the watcher saw while a release changed.
#[derive(Default, Debug)]
struct Watched {
    polls: u32,
    /// (pod, leads?) in the order scraped.
    leader_samples: Vec<(String, bool)>,
    /// The Lease holders, each change once.
    holders: Vec<String>,
    creates: u32,
    unlinked: Vec<String>,
    failed: Vec<String>,
}

/// Two pods that led at once: pod X said it led in two scrapes in a row and another pod said
/// it led in a scrape between them (the scrapes are in time order, so both led then).
fn overlaps(samples: &[(String, bool)]) -> Vec<String> {
    let mut led_since: std::collections::HashMap<&str, usize> = Default::default();
    let mut last_lead: std::collections::HashMap<&str, usize> = Default::default();
    let mut out = Vec::new();
    for (j, (pod, leads)) in samples.iter().enumerate() {
        if !*leads {
            led_since.remove(pod.as_str());
            continue;
        }
        // i: this pod's previous scrape, in which it led too.
        if let Some(&i) = led_since.get(pod.as_str()) {
            for (other, &m) in &last_lead {
                if *other != pod.as_str() && m > i && m < j {
                    out.push(format!("{pod} led at samples {i} and {j}, {other} at {m}"));
                }
            }
        }
        led_since.insert(pod, j);
        last_lead.insert(pod, j);
    }
    out
}

#[test]
fn overlapping_leaders_are_found_only_when_both_led_at_once() {
    let s = |v: &[(&str, bool)]| -> Vec<(String, bool)> {
        v.iter().map(|(p, l)| (p.to_string(), *l)).collect()
    };
    // A handover: a stops leading, then b leads.
    assert!(
        overlaps(&s(&[
            ("a", true),
            ("b", false),
            ("a", false),
            ("b", true),
            ("a", false)
        ]))
        .is_empty()
    );
    // Sampled across the handover (a, then b after it): never two at once.
    assert!(overlaps(&s(&[("a", true), ("b", true), ("a", false), ("b", true)])).is_empty());
    // a led before and after b said it led.
    assert_eq!(
        overlaps(&s(&[("a", true), ("b", true), ("a", true)])).len(),
        1
    );
}

impl<'a> Upgrades<'a> {
    async fn start(cluster: &'static Cluster, client: &'a kube::Client) -> Upgrades<'a> {
        let ns = support::test_namespace(
            client,
            "node-upgrade",
            &[("podgroup-sync.io/enabled", "true")],
        )
        .await;
        let mut made = Vec::new();
        for (i, (kind, backend)) in [
            (jobs::Kind::PyTorchJob, Backend::SchedulerPlugins),
            (jobs::Kind::PyTorchJob, Backend::Volcano),
            (jobs::Kind::TFJob, Backend::SchedulerPlugins),
        ]
        .into_iter()
        .enumerate()
        {
            let name = format!("up-{i}");
            jobs::create(client, &ns, kind, &jobs::job(kind, backend, &name, 3)).await;
            made.push((kind, backend, name));
        }
        // The pod an operator would create during the upgrade, for a job whose templates carry
        // no link: only the webhook links it.
        let job = jobs::create(
            client,
            &ns,
            jobs::Kind::PyTorchJob,
            &unlinked(jobs::job(
                jobs::Kind::PyTorchJob,
                Backend::SchedulerPlugins,
                "up-webhooked",
                2,
            )),
        )
        .await;
        made.push((
            jobs::Kind::PyTorchJob,
            Backend::SchedulerPlugins,
            "up-webhooked".to_string(),
        ));
        let pod = operator_pod(jobs::Kind::PyTorchJob, &job, "Worker", None);
        let up = Upgrades {
            cluster,
            client,
            ns,
            jobs: made,
            pod,
        };
        up.pod_groups().await;
        up
    }

    /// Each job's PodGroup resourceVersion, once all exist.
    async fn pod_groups(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (_, backend, name) in &self.jobs {
            let api: Api<kube::api::DynamicObject> =
                jobs::api(self.client, &self.ns, &backend.ar());
            let pg = wait_for(&format!("PodGroup {name}"), WAIT, || async {
                api.get_opt(name).await.ok().flatten()
            })
            .await;
            out.push(pg.resource_version().unwrap_or_default());
        }
        out
    }

    /// Runs `change` (a helm upgrade or rollback) while a thread scrapes every controller pod's
    /// leader gauge, follows the Lease and creates the operator's pod (dry run) through the
    /// webhook every 100 ms; then waits for the new leader to have resynced every job and
    /// asserts what an upgrade must keep.
    async fn across(&self, what: &str, stopping: Stopping, change: impl FnOnce()) {
        let (writes_before, _) = self.cluster.pod_group_and_event_writes();
        let versions_before = self.pod_groups().await;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let watcher = self.watch(stop.clone());
        let started = Instant::now();
        change();
        let changed = started.elapsed();
        let leader = self.resynced().await;
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        let watched = watcher.join().expect("the watcher");
        let (writes_after, _) = self.cluster.pod_group_and_event_writes();
        let versions_after = self.pod_groups().await;
        let two = overlaps(&watched.leader_samples);
        eprintln!(
            "figure: {what}: helm returned after {:.1} s, the new leader {leader} resynced after \
             {:.1} s; {} polls, {} leader samples, holders {:?}, {} pods created through the \
             webhook, {} unlinked, {} refused; PodGroup writes {}",
            changed.as_secs_f64(),
            started.elapsed().as_secs_f64(),
            watched.polls,
            watched.leader_samples.len(),
            watched.holders,
            watched.creates,
            watched.unlinked.len(),
            watched.failed.len(),
            writes_after - writes_before
        );
        assert!(two.is_empty(), "{what}: two leaders at once: {two:?}");
        assert!(
            watched.holders.len() >= 2,
            "{what}: the Lease was handed over (the leader's pod was replaced): {:?}",
            watched.holders
        );
        assert!(
            watched.creates >= 10,
            "{what}: the watcher created pods throughout: {watched:?}"
        );
        assert!(
            watched.failed.is_empty(),
            "{what}: pod creation refused: {:?}",
            watched.failed
        );
        if stopping == Stopping::This {
            assert!(
                watched.unlinked.is_empty(),
                "{what}: every pod created while this release's replicas stopped was linked: unlinked {:?}",
                watched.unlinked
            );
        }
        assert_eq!(
            writes_after - writes_before,
            0.0,
            "{what}: the API server served PodGroup writes"
        );
        assert_eq!(
            versions_before, versions_after,
            "{what}: a PodGroup changed"
        );
    }

    fn watch(
        &self,
        stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    ) -> std::thread::JoinHandle<Watched> {
        let (cluster, ns, pod) = (self.cluster, self.ns.clone(), self.pod.clone());
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let client = cluster.client().await;
                let mut w = Watched::default();
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    w.polls += 1;
                    for p in controller_pods(&client).await {
                        let Some(ip) = p.status.as_ref().and_then(|s| s.pod_ip.clone()) else {
                            continue;
                        };
                        if let Some((200, body)) =
                            http_get(format!("{ip}:8080").parse().unwrap(), "/metrics")
                        {
                            let leads = metric_sum(&body, "podgroup_sync_leader", &[]) == 1.0;
                            w.leader_samples.push((p.name_any(), leads));
                        }
                    }
                    if let Some(h) = lease_holder(&client).await
                        && w.holders.last() != Some(&h)
                    {
                        w.holders.push(h);
                    }
                    let created = Api::<Pod>::namespaced(client.clone(), &ns)
                        .create(
                            &kube::api::PostParams {
                                dry_run: true,
                                ..Default::default()
                            },
                            &pod,
                        )
                        .await;
                    match created {
                        Ok(answered) => {
                            w.creates += 1;
                            if link_of(&answered, Backend::SchedulerPlugins).0.as_deref()
                                != Some("up-webhooked")
                            {
                                w.unlinked.push(format!("poll {}", w.polls));
                            }
                        }
                        Err(e) => w.failed.push(e.to_string()),
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                w
            })
        })
    }

    /// Waits until two Ready pods run, one holds the Lease, and its reconciles have covered
    /// every job with nothing queued; the leader's name.
    async fn resynced(&self) -> String {
        wait_for("the new leader's resync", WAIT, || async {
            let pods = controller_pods(self.client).await;
            if pods.len() != 2 || !pods.iter().all(ready) {
                return None;
            }
            let leader = lease_holder(self.client).await?;
            let pod = pods.iter().find(|p| p.name_any() == leader)?;
            let ip = pod.status.as_ref()?.pod_ip.clone()?;
            let (_, body) = http_get(format!("{ip}:8080").parse().ok()?, "/metrics")?;
            let reconciled = metric_sum(&body, "podgroup_sync_reconcile_total", &[]);
            let queued = metric_sum(&body, "podgroup_sync_queued_jobs", &[]);
            (metric_sum(&body, "podgroup_sync_leader", &[]) == 1.0
                && reconciled >= self.jobs.len() as f64
                && queued == 0.0)
                .then_some(leader)
        })
        .await
    }
}

fn helm_rollback(cluster: &Cluster, revision: u32) {
    let out = run_helm(&[
        "rollback",
        RELEASE,
        &revision.to_string(),
        "--namespace",
        RELEASE_NS,
        "--kubeconfig",
        cluster.kubeconfig.to_str().unwrap(),
        "--wait",
        "--timeout=180s",
    ]);
    assert!(
        out.status.success(),
        "helm rollback failed:\n{}",
        helm_stderr(&out)
    );
}

/// `helm test`: the chart's test pod checks the installation from inside the cluster; then,
/// with a permission the controller needs taken away, it fails and names it.
async fn helm_test(cluster: &Cluster) {
    let test = || {
        run_helm(&[
            "test",
            RELEASE,
            "--namespace",
            RELEASE_NS,
            "--kubeconfig",
            cluster.kubeconfig.to_str().unwrap(),
            "--logs",
            "--timeout=120s",
        ])
    };
    let started = Instant::now();
    let out = test();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        helm_stderr(&out)
    );
    eprintln!(
        "figure: helm test passed in {:.1} s:\n{text}",
        started.elapsed().as_secs_f64()
    );
    assert!(out.status.success(), "helm test failed:\n{text}");
    for check in [
        "ok   Deployment podgroup-sync-system/pgs-podgroup-sync: 2 of 2 replicas Ready",
        "ok   GET /readyz through Service",
        "ok   MutatingWebhookConfiguration pgs-podgroup-sync:",
        "answer over TLS verified against their caBundle",
        "ok   RBAC of system:serviceaccount:podgroup-sync-system:",
    ] {
        assert!(text.contains(check), "{check}:\n{text}");
    }
    // The Lease rules taken away: the test fails and says which permission is missing.
    let role = format!("{FULLNAME}-leader-election");
    let saved = cluster.kubectl_ok(&["get", "role", "-n", RELEASE_NS, &role, "-o", "json"]);
    cluster.kubectl_ok(&["delete", "role", "-n", RELEASE_NS, &role]);
    let out = test();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        helm_stderr(&out)
    );
    let file = std::env::temp_dir().join(format!("pgs-role-{}.json", std::process::id()));
    std::fs::write(&file, saved).unwrap();
    cluster.kubectl_ok(&["create", "-f", file.to_str().unwrap()]);
    assert!(
        !out.status.success(),
        "helm test passed without the Lease rules:\n{text}"
    );
    assert!(
        text.contains("missing: create coordination.k8s.io/leases in podgroup-sync-system"),
        "{text}"
    );
}

/// What stop.sh promises: no process of the node (kubelet, kube-proxy, kube-scheduler,
/// containerd, shims, containers), no mount under its directory, no cgroup of its own.
fn stopping_the_node_leaves_nothing_behind(node: &Node) {
    let pids = std::fs::read_to_string(node.dir.join("pids")).unwrap_or_default();
    let before: Vec<u32> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .filter(|pid| in_node_cgroup(*pid))
        .collect();
    assert!(
        before.len() >= 4,
        "the containers (2 pause, 2 controllers) run in the node's cgroup: {before:?}"
    );
    stdout_of(
        Command::new(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/node/stop.sh"))
            .arg(&node.dir),
    );
    let dir = node.dir.to_string_lossy().into_owned();
    let ours: Vec<String> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| {
            let pid: u32 = e.ok()?.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            (cmdline.contains(&dir) || in_node_cgroup(pid)).then(|| format!("{pid}: {cmdline}"))
        })
        .collect();
    assert!(
        ours.is_empty(),
        "still running: {ours:?} (pids were {pids})"
    );
    let mounts: Vec<String> = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter(|l| {
            l.split_whitespace()
                .nth(4)
                .is_some_and(|m| m.starts_with(&dir))
        })
        .map(str::to_string)
        .collect();
    assert!(mounts.is_empty(), "still mounted: {mounts:?}");
    let cgroup = node_cgroup_root(node);
    let left: Vec<PathBuf> = std::fs::read_dir("/sys/fs/cgroup")
        .unwrap()
        .filter_map(|e| Some(e.ok()?.path().join(cgroup.trim_start_matches('/'))))
        .chain([Path::new("/sys/fs/cgroup").join(cgroup.trim_start_matches('/'))])
        .filter(|p| p.exists())
        .collect();
    assert!(left.is_empty(), "cgroups left: {left:?}");
}

/// The kubelet's cgroup root for this node, from start.sh's `env` file.
fn node_cgroup_root(node: &Node) -> String {
    let env = std::fs::read_to_string(node.dir.join("env")).expect("the node's env file");
    env.lines()
        .find_map(|l| l.strip_prefix("export CGROUP_ROOT="))
        .expect("CGROUP_ROOT in the env file")
        .trim_matches('\'')
        .to_string()
}

fn in_node_cgroup(pid: u32) -> bool {
    let root = format!("{}/", node_cgroup_root(node()));
    std::fs::read_to_string(format!("/proc/{pid}/cgroup")).is_ok_and(|c| {
        c.lines()
            .any(|l| l.split(':').nth(2).is_some_and(|p| p.starts_with(&root)))
    })
}

/// The lifecycle of one job per kind (both backends) through the in-cluster configuration, and
/// the API server calling the webhook through its Service.
async fn jobs_of_every_kind_and_the_webhook(
    client: &kube::Client,
    cluster: &Cluster,
    leader: &str,
) {
    // The lifecycle of one job per kind, both backends, through the in-cluster configuration.
    let ns =
        support::test_namespace(client, "node-jobs", &[("podgroup-sync.io/enabled", "true")]).await;
    let log = || pod_logs(cluster, leader);
    for (i, kind) in KINDS.into_iter().enumerate() {
        let backend = [Backend::SchedulerPlugins, Backend::Volcano][i % 2];
        let name = format!("gang-{}", i);
        Gang {
            client,
            ns: &ns,
            kind,
            backend,
            name: &name,
            log: &log,
        }
        .whole_lifecycle()
        .await;
    }

    // The API server reaches the webhook through its Service: a pod of a job created without
    // links comes back linked (a dry run: nothing is left to schedule).
    let job = jobs::create(
        client,
        &ns,
        jobs::Kind::PyTorchJob,
        &unlinked(jobs::job(
            jobs::Kind::PyTorchJob,
            Backend::SchedulerPlugins,
            "webhooked",
            2,
        )),
    )
    .await;
    let pod = operator_pod(jobs::Kind::PyTorchJob, &job, "Worker", None);
    let answered = dry_run_create(client, &ns, &pod).await;
    assert_eq!(
        link_of(&answered, Backend::SchedulerPlugins),
        (
            Some("webhooked".into()),
            Some("scheduler-plugins-scheduler".into())
        ),
        "the webhook answered through its Service"
    );
}

/// Deleting the leader pod: the kubelet sends SIGTERM, the controller releases the Lease (a
/// holder of none and a 1 s duration) well before the grace period and before the Lease would
/// have expired on its own, and the other replica takes it at its next retry.
async fn leader_pod_deleted_hands_over(client: &kube::Client, leader: &str) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), RELEASE_NS);
    let deleted_at = Instant::now();
    pods.delete(leader, &DeleteParams::default())
        .await
        .expect("delete the leader pod");
    let next = wait_for("another leader", WAIT, || async {
        lease_holder(client).await.filter(|h| h != leader)
    })
    .await;
    let handover = deleted_at.elapsed();
    wait_for("the old leader pod gone", WAIT, || async {
        matches!(pods.get_opt(leader).await, Ok(None)).then_some(())
    })
    .await;
    let stopped = deleted_at.elapsed();
    eprintln!(
        "figure: leader pod deleted: new leader {next} after {:.1} s, old pod gone after {:.1} s",
        handover.as_secs_f64(),
        stopped.as_secs_f64()
    );
    // Without the release the other replica would wait out leaseDurationSeconds (15 s).
    assert!(
        handover < Duration::from_secs(15),
        "handover took {handover:?}: the Lease was not released on SIGTERM"
    );
    assert!(
        stopped < Duration::from_secs(30),
        "the old pod outlived its grace period ({stopped:?})"
    );
    // The Deployment replaces the pod, and the replacement is Ready and standing by.
    wait_for("two Ready pods again", WAIT, || async {
        let pods = controller_pods(client).await;
        (pods.iter().filter(|p| ready(p)).count() == 2).then_some(())
    })
    .await;
}

//! Gang-health benchmark (SPEC §10): what the stale-PodGroup audit costs with thousands of jobs,
//! and what the feasibility check's Node cache costs in memory with a thousand nodes.
//!
//! ```sh
//! cargo bench --bench health -- [--jobs 5000] [--namespaces 100] [--nodes 1000] [--window 60] [--out DIR]
//! ```
//! Audit phase (a fresh control plane): the release controller with `--audit-interval-seconds 5`
//! gets `--jobs` PyTorchJobs over `--namespaces` enabled namespaces and creates their PodGroups;
//! then, over `--window` seconds with nothing changing, the audit passes are counted and timed
//! (`podgroup_sync_audit_duration_seconds`), the controller's CPU is read from /proc, and the API
//! server's own request counters give the requests made on jobs, PodGroups and Events (none but
//! the watches are expected: the audit reads its caches). Node phase (another fresh control
//! plane): `--nodes` Node objects shaped like kwok's (labels, conditions, images, addresses), then
//! the controller's RSS without and with `--gang-feasibility`. Correctness fails the run (a
//! PodGroup missing, a request made by the audit); timing never does. Run by
//! `cargo test --all-targets` (no `--bench`) it prints one line and exits.

#[path = "../tests/support/mod.rs"]
mod support;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Parser;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::api::PostParams;
use kube::{Api, Client};
use serde_json::json;
use support::controller::{self, Controller, cpu_seconds, proc_status};
use support::jobs::{self, Backend, Kind};

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

#[derive(Parser, Debug)]
struct Cli {
    /// PyTorchJobs (and PodGroups) the audit looks at.
    #[arg(long, default_value_t = 5_000)]
    jobs: usize,
    /// Namespaces they are spread over.
    #[arg(long, default_value_t = 100)]
    namespaces: usize,
    /// Nodes in the Node cache phase.
    #[arg(long, default_value_t = 1_000)]
    nodes: usize,
    /// Seconds of steady state in which audit passes are measured.
    #[arg(long, default_value_t = 60)]
    window: u64,
    /// Where RESULTS.md goes.
    #[arg(long, default_value = "target/bench/health")]
    out: PathBuf,
    /// Passed by `cargo bench`.
    #[arg(long, hide = true)]
    bench: bool,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    if !cli.bench {
        println!("gang-health benchmark: run with `cargo bench --bench health`");
        return std::process::ExitCode::SUCCESS;
    }
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    match rt.block_on(run(&cli)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gang-health benchmark failed: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// The audit's cost in steady state.
struct Audit {
    converge_s: f64,
    passes: f64,
    mean_pass_ms: f64,
    cpu_per_pass_ms: f64,
    /// Non-watch requests on jobs, PodGroups and Events during the window.
    requests: f64,
    rss_mib: f64,
}

/// Controller memory with the Node cache off and on.
struct Nodes {
    off: (f64, f64),
    on: (f64, f64),
    node_bytes: usize,
}

async fn run(cli: &Cli) -> Res<()> {
    let load_before = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let audit = audit_phase(cli).await?;
    let nodes = node_phase(cli).await?;
    let report = report(cli, &audit, &nodes, load_before.trim());
    println!("{report}");
    std::fs::create_dir_all(&cli.out)?;
    std::fs::write(cli.out.join("RESULTS.md"), &report)?;
    Ok(())
}

async fn audit_phase(cli: &Cli) -> Res<Audit> {
    let cluster = support::private_cluster();
    let client = cluster.client().await;
    let mut namespaces = Vec::new();
    for i in 0..cli.namespaces {
        let ns = support::test_namespace(
            &client,
            &format!("audit-{i}"),
            &[("podgroup-sync.io/enabled", "true")],
        )
        .await;
        namespaces.push(ns);
    }
    let ctl = controller::start(&cluster, None, &["--audit-interval-seconds", "5"]);
    let started = Instant::now();
    let creates = futures::stream::iter(0..cli.jobs)
        .map(|i| {
            let client = client.clone();
            let ns = namespaces[i % namespaces.len()].clone();
            async move {
                let job = jobs::job(
                    Kind::PyTorchJob,
                    Backend::SchedulerPlugins,
                    &format!("job-{i}"),
                    1,
                );
                jobs::create(&client, &ns, Kind::PyTorchJob, &job).await;
            }
        })
        .buffer_unordered(32);
    creates.collect::<Vec<()>>().await;
    let jobs = cli.jobs as f64;
    support::wait_for("every PodGroup", Duration::from_secs(600), || async {
        (ctl.metric("podgroup_sync_podgroup_writes_total", &[("op", "create")]) >= jobs)
            .then_some(())
    })
    .await;
    let converge_s = started.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_secs(10)).await;
    let before = (
        ctl.metric("podgroup_sync_audit_duration_seconds_count", &[]),
        ctl.metric("podgroup_sync_audit_duration_seconds_sum", &[]),
        cpu_seconds(ctl.child.id()),
        audited_requests(&client).await,
    );
    tokio::time::sleep(Duration::from_secs(cli.window)).await;
    let after = (
        ctl.metric("podgroup_sync_audit_duration_seconds_count", &[]),
        ctl.metric("podgroup_sync_audit_duration_seconds_sum", &[]),
        cpu_seconds(ctl.child.id()),
        audited_requests(&client).await,
    );
    let passes = after.0 - before.0;
    let writes = ctl.metric("podgroup_sync_podgroup_writes_total", &[]);
    if writes != jobs {
        return Err(format!(
            "{writes} PodGroup writes for {jobs} jobs (the audit must write nothing)"
        )
        .into());
    }
    let requests = after.3 - before.3;
    if requests != 0.0 {
        return Err(format!(
            "{requests} requests on jobs, PodGroups or Events during the audit window"
        )
        .into());
    }
    let audit = Audit {
        converge_s,
        passes,
        mean_pass_ms: 1000.0 * (after.1 - before.1) / passes.max(1.0),
        cpu_per_pass_ms: 1000.0 * (after.2 - before.2) / passes.max(1.0),
        requests,
        rss_mib: proc_status(ctl.child.id()).0,
    };
    drop(ctl);
    support::stop_cluster(&cluster);
    Ok(audit)
}

/// Non-watch requests the API server served on jobs, PodGroups and Events.
async fn audited_requests(client: &Client) -> f64 {
    let req = hyper::Request::get("/metrics")
        .body(Vec::new())
        .expect("request");
    let text = client.request_text(req).await.unwrap_or_default();
    text.lines()
        .filter(|l| l.starts_with("apiserver_request_total{"))
        .filter(|l| !l.contains("verb=\"WATCH\""))
        .filter(|l| {
            ["pytorchjobs", "podgroups", "events"]
                .iter()
                .any(|r| l.contains(&format!("resource=\"{r}\"")))
        })
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

/// A Node shaped like the ones kwok manages: what a real node object weighs in the watch.
fn node(i: usize) -> Node {
    let name = format!("kwok-node-{i:05}");
    let images: Vec<_> = (0..12)
        .map(|k| json!({"names": [format!("registry.example.com/team/training-image-{k}@sha256:{:064x}", k * 7919 + i), format!("registry.example.com/team/training-image-{k}:v1.{k}")], "sizeBytes": 1_500_000_000u64 + k as u64}))
        .collect();
    let conditions: Vec<_> = ["Ready", "MemoryPressure", "DiskPressure", "PIDPressure", "NetworkUnavailable"]
        .iter()
        .map(|t| json!({"type": t, "status": if *t == "Ready" {"True"} else {"False"}, "reason": format!("Kubelet{t}"),
            "message": format!("kubelet reports {t}"), "lastHeartbeatTime": "2026-12-01T00:00:00Z", "lastTransitionTime": "2026-12-01T00:00:00Z"}))
        .collect();
    let resources = json!({"cpu": "96", "memory": "1536Gi", "pods": "110", "nvidia.com/gpu": "8", "ephemeral-storage": "3Ti"});
    serde_json::from_value(json!({
        "metadata": {"name": name, "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
                "node.kubernetes.io/instance-type": "gpu-8x", "topology.kubernetes.io/zone": format!("zone-{}", i % 3),
                "nvidia.com/gpu.product": "H100-SXM5-80GB", "type": "kwok"}},
        "spec": {"podCIDR": format!("10.{}.{}.0/24", i / 256, i % 256), "providerID": format!("kwok://{name}"),
            "taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]},
        "status": {"capacity": resources, "allocatable": resources, "conditions": conditions, "images": images,
            "addresses": [{"type": "InternalIP", "address": format!("10.1.{}.{}", i / 256, i % 256)}, {"type": "Hostname", "address": name}],
            "nodeInfo": {"architecture": "amd64", "bootID": "", "containerRuntimeVersion": "containerd://2.1.0", "kernelVersion": "6.8.0",
                "kubeProxyVersion": "", "kubeletVersion": "v1.34.4", "machineID": "", "operatingSystem": "linux",
                "osImage": "Ubuntu 24.04", "systemUUID": ""}},
    }))
    .expect("node")
}

async fn node_phase(cli: &Cli) -> Res<Nodes> {
    let cluster = support::private_cluster();
    let client = cluster.client().await;
    let api: Api<Node> = Api::all(client.clone());
    let node_bytes = serde_json::to_vec(&node(0))?.len();
    let creates = futures::stream::iter(0..cli.nodes)
        .map(|i| {
            let api = api.clone();
            async move {
                let n = node(i);
                let created = api
                    .create(&PostParams::default(), &n)
                    .await
                    .expect("create node");
                // The API server drops status on create; a kubelet (or kwok) sets it.
                let status = json!({"status": serde_json::to_value(&n).expect("node")["status"]});
                api.patch_status(
                    created.metadata.name.as_deref().unwrap_or_default(),
                    &Default::default(),
                    &kube::api::Patch::Merge(&status),
                )
                .await
                .expect("node status");
            }
        })
        .buffer_unordered(32);
    creates.collect::<Vec<()>>().await;
    let off = steady_memory(&cluster, &[]).await;
    let on = steady_memory(&cluster, &["--gang-feasibility"]).await;
    support::stop_cluster(&cluster);
    Ok(Nodes {
        off,
        on,
        node_bytes,
    })
}

/// (VmRSS, VmHWM) in MiB of a controller with these flags, 15 s after it is ready.
async fn steady_memory(cluster: &support::Cluster, args: &[&str]) -> (f64, f64) {
    let ctl: Controller = controller::start(cluster, None, args);
    tokio::time::sleep(Duration::from_secs(15)).await;
    proc_status(ctl.child.id())
}

fn report(cli: &Cli, a: &Audit, n: &Nodes, load: &str) -> String {
    let cores = std::thread::available_parallelism().map_or(0, |c| c.get());
    let per_node_kib = 1024.0 * (n.on.0 - n.off.0) / cli.nodes as f64;
    format!(
        "# Gang-health benchmark\n\n{cores} cores; load average before the run: {load}. A fresh control plane per phase; the release controller.\n\n\
         ## The stale-PodGroup audit\n\n{} PyTorchJobs over {} namespaces, every one with its PodGroup (created in {:.1} s); \
         `--audit-interval-seconds 5`, measured over {} s with nothing changing.\n\n\
         | | |\n|---|---|\n\
         | audit passes | {:.0} |\n\
         | mean pass (wall, from `podgroup_sync_audit_duration_seconds`) | {:.2} ms |\n\
         | controller CPU per pass (all the process did in the window ÷ passes) | {:.2} ms |\n\
         | requests on jobs, PodGroups and Events in the window (API server counters, watches excluded) | {:.0} |\n\
         | controller RSS | {:.1} MiB |\n\n\
         ## The feasibility check's Node cache\n\n{} Nodes shaped like kwok's ({} bytes of JSON each: labels, conditions, 12 images, addresses, node info); \
         RSS 15 s after the controller is ready.\n\n\
         | | VmRSS | VmHWM |\n|---|---|---|\n\
         | without `--gang-feasibility` | {:.1} MiB | {:.1} MiB |\n\
         | with `--gang-feasibility` | {:.1} MiB | {:.1} MiB |\n\n\
         The Node cache costs {:.2} KiB per node in steady state (VmRSS difference ÷ nodes; the stripped \
         objects, their parsed snapshot, and what the allocator keeps from reading the first list in pages of 50 full Nodes).\n",
        cli.jobs,
        cli.namespaces,
        a.converge_s,
        cli.window,
        a.passes,
        a.mean_pass_ms,
        a.cpu_per_pass_ms,
        a.requests,
        a.rss_mib,
        cli.nodes,
        n.node_bytes,
        n.off.0,
        n.off.1,
        n.on.0,
        n.on.1,
        per_node_kib,
    )
}

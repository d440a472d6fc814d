//! Pod-link webhook benchmark (SPEC §8): a burst of pod creations, the way the operators create
//! them, on a fresh control plane twice — once with the controller's webhook registered and
//! once without — so the latency the webhook adds to a pod create and the memory it costs the
//! controller are measured side by side.
//!
//! ```sh
//! cargo bench --bench webhook -- [--pods 20000] [--jobs 100] [--concurrency 32] [--out DIR]
//! ```
//! Per phase: the release controller starts (with `--webhook` in the second), `--jobs`
//! PyTorchJobs without any pod link get their PodGroups, then `--pods` pods owned by them are
//! created with `--concurrency` in flight. Reported: pod-create latency p50/p99 as the client sees
//! it, the webhook's own admission latency (`podgroup_sync_admission_duration_seconds`), the API
//! server's view of the call (`apiserver_admission_webhook_admission_duration_seconds`), and the
//! controller's RSS and peak RSS. Correctness fails the run (every pod linked with the webhook,
//! none without); timing never does. Run by `cargo test --all-targets` (no `--bench`) it prints
//! one line and exits.

#[path = "../tests/support/mod.rs"]
mod support;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Parser;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DynamicObject, ListParams, PostParams};
use kube::{Api, Client};
use support::controller::{self, cpu_seconds, proc_status};
use support::jobs::{self, Backend, Kind};
use support::webhook as wh;

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

#[derive(Parser, Debug)]
struct Cli {
    /// Pods created per phase.
    #[arg(long, default_value_t = 20_000)]
    pods: usize,
    /// PyTorchJobs owning them.
    #[arg(long, default_value_t = 100)]
    jobs: usize,
    /// Pod creates in flight.
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// Where RESULTS.md goes.
    #[arg(long, default_value = "target/bench/webhook")]
    out: PathBuf,
    /// Instead of off against on: the webhook with only the Kubeflow entry against every entry
    /// the chart registers by default (Kubeflow, JobSet, Ray), in the order A B B A so that a
    /// drift over the run cancels out; the pods are Kubeflow pods, so the difference is what the
    /// other entries' objectSelectors cost the API server per pod create.
    #[arg(long)]
    entries: bool,
    /// Passed by `cargo bench`.
    #[arg(long, hide = true)]
    bench: bool,
}

/// Which webhook configuration a phase runs with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hook {
    Off,
    /// Only the Kubeflow operators' entry.
    KubeflowEntry,
    /// Every entry the chart registers by default.
    AllEntries,
    /// Every entry, in a namespace the controller does not manage: every pod is sent to the
    /// webhook and answered unchanged — what being called at all costs, without a patch.
    Unpatched,
}

impl Hook {
    fn label(self) -> &'static str {
        match self {
            Hook::Off => "webhook off",
            Hook::KubeflowEntry => "Kubeflow entry only",
            Hook::AllEntries => "all entries (Kubeflow, JobSet, LWS, Ray)",
            Hook::Unpatched => "webhook called, nothing to add",
        }
    }
}

/// What one phase measured.
#[derive(Debug)]
struct Phase {
    seconds: f64,
    /// CPU seconds the controller used during the burst.
    cpu: f64,
    /// CPU seconds kube-apiserver and etcd used during the burst.
    apiserver_cpu: f64,
    etcd_cpu: f64,
    create_p50_ms: f64,
    create_p99_ms: f64,
    admission_p50_ms: Option<f64>,
    admission_p99_ms: Option<f64>,
    apiserver_p50_ms: Option<f64>,
    apiserver_p99_ms: Option<f64>,
    /// The share of the API server's webhook calls that took ≤ 5 ms, in percent.
    apiserver_within_5ms: Option<f64>,
    admissions: f64,
    /// TLS connections the API server opened to the webhook.
    connections: f64,
    /// Pods the API server sent to the controller's watch of unlinked pods during the burst.
    pod_watch_events: f64,
    rss_mib: f64,
    hwm_mib: f64,
    linked: usize,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    if !cli.bench {
        println!("webhook benchmark: run with `cargo bench --bench webhook`");
        return std::process::ExitCode::SUCCESS;
    }
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    match rt.block_on(run(&cli)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("webhook benchmark failed: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(cli: &Cli) -> Res<()> {
    let load_before = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let report = if cli.entries {
        let mut phases = Vec::new();
        for hook in [
            Hook::KubeflowEntry,
            Hook::AllEntries,
            Hook::AllEntries,
            Hook::KubeflowEntry,
        ] {
            phases.push((hook, phase(cli, hook).await?));
        }
        entries_report(cli, &phases, load_before.trim())
    } else {
        let off = phase(cli, Hook::Off).await?;
        let on = phase(cli, Hook::AllEntries).await?;
        let called = phase(cli, Hook::Unpatched).await?;
        report(cli, &off, &on, &called, load_before.trim())
    };
    println!("{report}");
    std::fs::create_dir_all(&cli.out)?;
    std::fs::write(cli.out.join("RESULTS.md"), &report)?;
    Ok(())
}

async fn phase(cli: &Cli, hook: Hook) -> Res<Phase> {
    let webhook = hook != Hook::Off;
    let cluster = support::private_cluster();
    let client = cluster.client().await;
    let dir = cluster.work_dir.clone().unwrap_or_else(std::env::temp_dir);
    let certs = wh::certs(&dir.join("webhook"), "bench-webhook-ca");
    let port = controller::free_port();
    let mut args: Vec<String> = vec!["--link-coscheduling-scheduler-name=".into()];
    if webhook {
        args.extend(wh::args(port, &certs));
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut ctl = controller::start(&cluster, None, &args);
    if webhook {
        let mut json = wh::configuration_json("bench", port, &certs.ca_pem);
        if hook == Hook::KubeflowEntry {
            json["webhooks"]
                .as_array_mut()
                .expect("webhooks")
                .truncate(1);
        }
        let config: k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration =
            serde_json::from_value(json)?;
        wh::register(&client, &config).await;
    }
    let managed = hook != Hook::Unpatched;
    let mode = if managed { "true" } else { "false" };
    let ns = support::test_namespace(
        &client,
        "bench-webhook",
        &[("podgroup-sync.io/enabled", mode)],
    )
    .await;
    let mut owners: Vec<DynamicObject> = Vec::new();
    for i in 0..cli.jobs {
        let manifest = wh::unlinked(jobs::job(
            Kind::PyTorchJob,
            Backend::SchedulerPlugins,
            &format!("job-{i}"),
            2,
        ));
        owners.push(jobs::create(&client, &ns, Kind::PyTorchJob, &manifest).await);
    }
    let pgs = jobs::api(&client, &ns, &Backend::SchedulerPlugins.ar());
    let expected_pod_groups = if managed { cli.jobs } else { 0 };
    support::wait_for("every PodGroup", Duration::from_secs(120), || async {
        let n = pgs.list(&ListParams::default()).await.ok()?.items.len();
        (n == expected_pod_groups).then_some(())
    })
    .await;
    let templates: Vec<Pod> = owners
        .iter()
        .map(|job| wh::operator_pod(Kind::PyTorchJob, job, "Worker", None))
        .collect();
    let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let apiserver_before = apiserver_metrics(&client).await;
    let component_cpu = |comm: &str| cluster.component_pid(comm).map_or(f64::NAN, cpu_seconds);
    let pod_events = |text: &str| {
        controller::metric_sum(
            text,
            "podgroup_sync_watch_events_total",
            &[("resource", "pods")],
        )
    };
    let pod_events_before = pod_events(&ctl.metrics());
    let cpu_before = cpu_seconds(ctl.child.id());
    let (apiserver_cpu_before, etcd_cpu_before) =
        (component_cpu("kube-apiserver"), component_cpu("etcd"));
    let start = Instant::now();
    let latencies = burst(&api, &templates, cli.pods, cli.concurrency).await?;
    let seconds = start.elapsed().as_secs_f64();
    let cpu = cpu_seconds(ctl.child.id()) - cpu_before;
    let apiserver_cpu = component_cpu("kube-apiserver") - apiserver_cpu_before;
    let etcd_cpu = component_cpu("etcd") - etcd_cpu_before;
    let apiserver_after = apiserver_metrics(&client).await;
    let linked = api
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .filter(|p| wh::link_of(p, Backend::SchedulerPlugins).0.is_some())
        .count();
    let expected = if webhook && managed { cli.pods } else { 0 };
    if linked != expected {
        return Err(format!(
            "webhook {webhook}: {linked} of {} pods linked, expected {expected}",
            cli.pods
        )
        .into());
    }
    let ours = ctl.metrics();
    let stats = proc_status(ctl.child.id());
    let entry = [("name", "pod-link.podgroup-sync.io")];
    let phase = Phase {
        seconds,
        cpu,
        apiserver_cpu,
        etcd_cpu,
        create_p50_ms: percentile(&latencies, 0.50),
        create_p99_ms: percentile(&latencies, 0.99),
        admission_p50_ms: quantile(&ours, "podgroup_sync_admission_duration_seconds", &[], 0.50)
            .map(|s| s * 1000.0),
        admission_p99_ms: quantile(&ours, "podgroup_sync_admission_duration_seconds", &[], 0.99)
            .map(|s| s * 1000.0),
        apiserver_p50_ms: delta_quantile(&apiserver_before, &apiserver_after, &entry, 0.50),
        apiserver_p99_ms: delta_quantile(&apiserver_before, &apiserver_after, &entry, 0.99),
        apiserver_within_5ms: delta_share_within(
            &apiserver_before,
            &apiserver_after,
            &entry,
            0.005,
        ),
        admissions: controller::metric_sum(&ours, "podgroup_sync_admissions_total", &[]),
        connections: controller::metric_sum(
            &ours,
            "podgroup_sync_webhook_connections_total",
            &[("result", "accepted")],
        ),
        pod_watch_events: pod_events(&ours) - pod_events_before,
        rss_mib: stats.0,
        hwm_mib: stats.1,
        linked,
    };
    eprintln!("{}: {phase:?}", hook.label());
    ctl.stop();
    support::stop_cluster(&cluster);
    Ok(phase)
}

/// Creates `pods` pods cycling through `templates`, `concurrency` at a time; each create's
/// latency in milliseconds, sorted.
async fn burst(
    api: &Api<Pod>,
    templates: &[Pod],
    pods: usize,
    concurrency: usize,
) -> Res<Vec<f64>> {
    let mut latencies: Vec<f64> = futures::stream::iter(0..pods)
        .map(|i| {
            let api = api.clone();
            let pod = templates[i % templates.len()].clone();
            async move {
                let t = Instant::now();
                api.create(&PostParams::default(), &pod)
                    .await
                    .map(|_| t.elapsed().as_secs_f64() * 1000.0)
            }
        })
        .buffer_unordered(concurrency)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<_, _>>()?;
    latencies.sort_by(f64::total_cmp);
    Ok(latencies)
}

const APISERVER_HISTOGRAM: &str = "apiserver_admission_webhook_admission_duration_seconds";

async fn apiserver_metrics(client: &Client) -> String {
    let req = hyper::Request::get("/metrics")
        .body(Vec::new())
        .expect("request");
    client.request_text(req).await.unwrap_or_default()
}

/// A quantile of the API server's webhook histogram over what happened between two scrapes.
fn delta_quantile(before: &str, after: &str, labels: &[(&str, &str)], q: f64) -> Option<f64> {
    histogram_quantile(&delta_buckets(before, after, labels), q).map(|s| s * 1000.0)
}

/// The share of the API server's webhook calls in the burst that took at most `le` seconds (a
/// bucket bound: 0.005, 0.025, …), in percent.
fn delta_share_within(before: &str, after: &str, labels: &[(&str, &str)], le: f64) -> Option<f64> {
    let delta = delta_buckets(before, after, labels);
    let total = delta.iter().map(|(_, n)| *n).fold(0.0, f64::max);
    let within = delta.iter().find(|(l, _)| (*l - le).abs() < 1e-9)?.1;
    (total > 0.0).then(|| within / total * 100.0)
}

/// The histogram's cumulative buckets over the burst: `after` less `before`.
fn delta_buckets(before: &str, after: &str, labels: &[(&str, &str)]) -> Vec<(f64, f64)> {
    let b = buckets(before, APISERVER_HISTOGRAM, labels);
    let a = buckets(after, APISERVER_HISTOGRAM, labels);
    a.iter()
        .map(|(le, n)| {
            (
                *le,
                n - b.iter().find(|(l, _)| l == le).map_or(0.0, |(_, m)| *m),
            )
        })
        .collect()
}

fn quantile(text: &str, name: &str, labels: &[(&str, &str)], q: f64) -> Option<f64> {
    histogram_quantile(&buckets(text, name, labels), q)
}

/// The cumulative buckets (le, count) of a histogram, summed over the series matching `labels`.
fn buckets(text: &str, name: &str, labels: &[(&str, &str)]) -> Vec<(f64, f64)> {
    let mut les: Vec<f64> = text
        .lines()
        .filter(|l| l.starts_with(&format!("{name}_bucket{{")))
        .filter_map(|l| {
            let le = l.split("le=\"").nth(1)?.split('"').next()?;
            if le == "+Inf" {
                Some(f64::INFINITY)
            } else {
                le.parse().ok()
            }
        })
        .collect();
    les.sort_by(f64::total_cmp);
    les.dedup();
    les.into_iter()
        .map(|le| {
            let le_text = if le.is_infinite() {
                "+Inf".to_string()
            } else {
                format_le(le, text, name)
            };
            let mut with: Vec<(&str, &str)> = labels.to_vec();
            with.push(("le", &le_text));
            (
                le,
                controller::metric_sum(text, &format!("{name}_bucket"), &with),
            )
        })
        .collect()
}

/// The `le` label exactly as the exposition writes it for this bound.
fn format_le(le: f64, text: &str, name: &str) -> String {
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}_bucket{{")))
        .filter_map(|l| {
            l.split("le=\"")
                .nth(1)?
                .split('"')
                .next()
                .map(str::to_string)
        })
        .find(|s| s.parse::<f64>().ok() == Some(le))
        .unwrap_or_else(|| le.to_string())
}

/// Prometheus' histogram_quantile: linear interpolation inside the bucket holding rank q·total.
fn histogram_quantile(buckets: &[(f64, f64)], q: f64) -> Option<f64> {
    let total = buckets.last()?.1;
    if total <= 0.0 {
        return None;
    }
    let rank = q * total;
    let (mut lower, mut below) = (0.0, 0.0);
    for &(le, count) in buckets {
        if count >= rank {
            if le.is_infinite() {
                return Some(lower);
            }
            let inside = count - below;
            return Some(if inside > 0.0 {
                lower + (le - lower) * (rank - below) / inside
            } else {
                le
            });
        }
        (lower, below) = (le, count);
    }
    None
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len()) - 1]
}

/// The entries comparison: one row per phase in the order run, then the mean of each.
fn entries_report(cli: &Cli, phases: &[(Hook, Phase)], load: &str) -> String {
    let mut out = format!(
        "# Pod-link webhook: what the workload operators' entries cost\n\n{} Kubeflow pods owned by {} PyTorchJobs, {} creates in flight, \
         a fresh control plane per phase, phases in the order A B B A; {} cores; load average before the run: {load}.\n\n\
         | phase | entries | pods/s | client p50, ms | client p99, ms | API server call p99, ms |\n|---|---|---|---|---|---|\n",
        cli.pods,
        cli.jobs,
        cli.concurrency,
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    for (i, (hook, p)) in phases.iter().enumerate() {
        out.push_str(&format!(
            "| {} | {} | {:.0} | {:.2} | {:.2} | {} |\n",
            i + 1,
            hook.label(),
            cli.pods as f64 / p.seconds,
            p.create_p50_ms,
            p.create_p99_ms,
            ms(p.apiserver_p99_ms)
        ));
    }
    let mean = |hook: Hook, f: &dyn Fn(&Phase) -> f64| {
        let v: Vec<f64> = phases
            .iter()
            .filter(|(h, _)| *h == hook)
            .map(|(_, p)| f(p))
            .collect();
        v.iter().sum::<f64>() / v.len().max(1) as f64
    };
    let rate = |p: &Phase| cli.pods as f64 / p.seconds;
    let one = mean(Hook::KubeflowEntry, &rate);
    let all = mean(Hook::AllEntries, &rate);
    out.push_str(&format!(
        "\nMean pods/s: {one:.0} with the Kubeflow entry only, {all:.0} with all entries ({:+.1}%); \
         mean client p99 {:.2} ms against {:.2} ms.\n",
        (all / one - 1.0) * 100.0,
        mean(Hook::KubeflowEntry, &|p| p.create_p99_ms),
        mean(Hook::AllEntries, &|p| p.create_p99_ms)
    ));
    out
}

fn ms(v: Option<f64>) -> String {
    v.map_or("—".into(), |v| format!("{v:.2}"))
}

fn report(cli: &Cli, off: &Phase, on: &Phase, called: &Phase, load: &str) -> String {
    let mut out = format!(
        "# Pod-link webhook benchmark\n\n{} pods owned by {} PyTorchJobs, {} creates in flight, a fresh control plane per phase; \
         {} cores; load average before the run: {load}.\n\n\
         | | webhook off | webhook on | webhook called, nothing to add |\n|---|---|---|---|\n",
        cli.pods,
        cli.jobs,
        cli.concurrency,
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    let pods = cli.pods as f64;
    let per_pod = |cpu: f64| format!("{:.2} ({:.3})", cpu, cpu * 1000.0 / pods);
    type Cell<'a> = Box<dyn Fn(&Phase) -> String + 'a>;
    let rows: Vec<(&str, Cell)> = vec![
        (
            "pods created per second",
            Box::new(|p| format!("{:.0}", pods / p.seconds)),
        ),
        (
            "pod create p50 (client), ms",
            Box::new(|p| format!("{:.2}", p.create_p50_ms)),
        ),
        (
            "pod create p99 (client), ms",
            Box::new(|p| format!("{:.2}", p.create_p99_ms)),
        ),
        (
            "admission p50 (podgroup-sync), ms",
            Box::new(|p| ms(p.admission_p50_ms)),
        ),
        (
            "admission p99 (podgroup-sync), ms",
            Box::new(|p| ms(p.admission_p99_ms)),
        ),
        (
            "webhook call p50 (API server), ms",
            Box::new(|p| ms(p.apiserver_p50_ms)),
        ),
        (
            "webhook call p99 (API server), ms",
            Box::new(|p| ms(p.apiserver_p99_ms)),
        ),
        (
            "webhook calls within 5 ms (API server), %",
            Box::new(|p| {
                p.apiserver_within_5ms
                    .map_or("—".into(), |v| format!("{v:.1}"))
            }),
        ),
        (
            "controller RSS / peak RSS, MiB",
            Box::new(|p| format!("{:.1} / {:.1}", p.rss_mib, p.hwm_mib)),
        ),
        (
            "controller CPU in the burst, s (ms per pod)",
            Box::new(|p| per_pod(p.cpu)),
        ),
        (
            "kube-apiserver CPU in the burst, s (ms per pod)",
            Box::new(|p| per_pod(p.apiserver_cpu)),
        ),
        (
            "etcd CPU in the burst, s (ms per pod)",
            Box::new(|p| per_pod(p.etcd_cpu)),
        ),
        (
            "TLS connections to the webhook",
            Box::new(|p| format!("{}", p.connections)),
        ),
        (
            "pods sent to the unlinked pods' watch",
            Box::new(|p| format!("{}", p.pod_watch_events)),
        ),
        (
            "pods linked / admissions counted",
            Box::new(|p| format!("{} / {}", p.linked, p.admissions)),
        ),
    ];
    for (what, cell) in &rows {
        out.push_str(&format!(
            "| {what} | {} | {} | {} |\n",
            cell(off),
            cell(on),
            cell(called)
        ));
    }
    out.push_str(&format!(
        "\nWith the webhook, pods are created at **{:.1}%** of the rate without it ({:.1}% when \
         the webhook is called and adds nothing); per pod the API server uses {:+.3} ms more CPU \
         ({:+.3} ms for a call that adds nothing) and podgroup-sync {:.3} ms.\n",
        off.seconds / on.seconds * 100.0,
        off.seconds / called.seconds * 100.0,
        (on.apiserver_cpu - off.apiserver_cpu) * 1000.0 / pods,
        (called.apiserver_cpu - off.apiserver_cpu) * 1000.0 / pods,
        on.cpu * 1000.0 / pods,
    ));
    out.push_str(&format!(
        "The webhook adds {:+.2} ms at p50 and {:+.2} ms at p99 to a pod create as the client sees it; \
         the controller's peak RSS is {:+.1}% with it on (the webhook, its TLS and the pods' metadata watch).\n\
         The API server's histogram has buckets of 5, 25, 100 ms…: its quantiles are interpolated within them.\n",
        on.create_p50_ms - off.create_p50_ms,
        on.create_p99_ms - off.create_p99_ms,
        (on.hwm_mib / off.hwm_mib - 1.0) * 100.0
    ));
    out
}

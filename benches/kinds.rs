//! The cost of the any-workload kinds (SPEC §11; issue 29): a LeaderWorkerSet of `--groups`
//! groups — that many PodGroups from one object — and a JobSet of `--jobs` worker Jobs — one
//! PodGroup over all of them. Each on a fresh control plane, podgroup-sync against a bare client
//! that applies the same PodGroups itself (`--concurrency` in flight).
//!
//! ```sh
//! cargo bench --bench kinds -- [--groups 1000] [--jobs 1000] [--concurrency 16] [--out DIR]
//! ```
//! Reported per kind: time from the create to every PodGroup right, the bare client's time for
//! the same PodGroups, podgroup-sync's PodGroup writes per PodGroup (from its own counter; 1.00 is
//! one apply each) and again after 5 s with nothing changed (a quiet controller adds none), its
//! CPU seconds and RSS. A wrong or missing PodGroup fails the run; timing never does. Run by
//! `cargo test --all-targets` (no `--bench`) it prints one line and exits.

#[path = "../tests/support/mod.rs"]
mod support;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Parser;
use futures::StreamExt;
use kube::api::{DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};
use support::controller::{self, cpu_seconds, proc_status};
use support::jobs::{self, Backend, Kind};

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

#[derive(Parser, Debug)]
struct Cli {
    /// Groups of the LeaderWorkerSet (one PodGroup each; a leader and 3 workers per group).
    #[arg(long, default_value_t = 1000)]
    groups: u32,
    /// Worker Jobs of the JobSet (one pod each, beside its driver Job; one PodGroup).
    #[arg(long, default_value_t = 1000)]
    jobs: u32,
    /// The bare client's creates in flight, and the controller's --concurrency.
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// Runs of each contender per kind (fresh control planes each time); the report gives the
    /// median and the spread.
    #[arg(long, default_value_t = 3)]
    repeat: usize,
    /// Leave out the bare client (the smoke: two control planes instead of four).
    #[arg(long)]
    skip_bare: bool,
    /// Where RESULTS.md goes.
    #[arg(long, default_value = "target/bench/kinds")]
    out: PathBuf,
    /// Passed by `cargo bench`.
    #[arg(long, hide = true)]
    bench: bool,
}

/// One kind's figures.
#[derive(Debug)]
struct Row {
    kind: &'static str,
    pod_groups: usize,
    min_member: u64,
    ours_s: f64,
    bare_s: f64,
    writes: f64,
    writes_after_quiet: f64,
    cpu_s: f64,
    rss_mib: f64,
    /// The median of the runs' ratios (a run's two contenders share its conditions).
    ratio: f64,
    /// Every run's times.
    runs: String,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    if !cli.bench {
        println!("kinds benchmark: run with `cargo bench --bench kinds`");
        return std::process::ExitCode::SUCCESS;
    }
    support::use_workload_crds();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    match rt.block_on(run(&cli)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kinds benchmark failed: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(cli: &Cli) -> Res<()> {
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let started = Instant::now();
    let groups = cli.groups as usize;
    let lws = support::lws::lws(Backend::SchedulerPlugins, "lws", cli.groups, 4);
    let lws_min = support::lws::expected_group_spec(Backend::SchedulerPlugins, 4, true);
    let lws_row = kind(cli, "LeaderWorkerSet", &support::lws::ar(), lws, groups).await?;
    check_min(&lws_row, lws_min["minMember"].as_u64().unwrap_or_default())?;
    let js = jobs::job(Kind::JobSet, Backend::SchedulerPlugins, "js", cli.jobs);
    let js_row = kind(cli, "JobSet", &Kind::JobSet.ar(), js, 1).await?;
    // The driver and every worker.
    check_min(&js_row, u64::from(cli.jobs) + 1)?;
    let report = report(cli, &[lws_row, js_row], load.trim(), started.elapsed());
    println!("{report}");
    std::fs::create_dir_all(&cli.out)?;
    std::fs::write(cli.out.join("RESULTS.md"), &report)?;
    Ok(())
}

fn check_min(row: &Row, want: u64) -> Res<()> {
    if row.min_member != want {
        return Err(format!("{}: minMember {} (want {want})", row.kind, row.min_member).into());
    }
    Ok(())
}

/// `--repeat` times podgroup-sync on a fresh control plane, then the bare client on another;
/// the medians, with every run's times for the spread.
async fn kind(
    cli: &Cli,
    name: &'static str,
    ar: &kube::api::ApiResource,
    manifest: Value,
    pod_groups: usize,
) -> Res<Row> {
    let mut runs = Vec::new();
    for _ in 0..cli.repeat.max(1) {
        let (ours, wanted) = ours(cli, ar, manifest.clone(), pod_groups).await?;
        let bare_s = if cli.skip_bare {
            f64::NAN
        } else {
            bare(cli, &wanted).await?
        };
        let row = Row {
            kind: name,
            bare_s,
            ..ours
        };
        eprintln!("{row:?}");
        runs.push(row);
    }
    let median = |f: fn(&Row) -> f64| {
        let mut v: Vec<f64> = runs.iter().map(f).collect();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let spread = |f: fn(&Row) -> f64| {
        let show = |x: f64| match x.is_finite() {
            true => format!("{x:.2}"),
            false => "—".into(),
        };
        let v: Vec<String> = runs.iter().map(|r| show(f(r))).collect();
        v.join(", ")
    };
    let (ours_runs, bare_runs) = (spread(|r| r.ours_s), spread(|r| r.bare_s));
    let ratio_runs = spread(run_ratio);
    let row = Row {
        kind: name,
        pod_groups,
        min_member: runs.iter().map(|r| r.min_member).min().unwrap_or_default(),
        ours_s: median(|r| r.ours_s),
        bare_s: median(|r| r.bare_s),
        ratio: median(run_ratio),
        writes: runs.iter().map(|r| r.writes).fold(0.0, f64::max),
        writes_after_quiet: runs
            .iter()
            .map(|r| r.writes_after_quiet)
            .fold(0.0, f64::max),
        cpu_s: median(|r| r.cpu_s),
        rss_mib: median(|r| r.rss_mib),
        runs: format!("podgroup-sync {ours_runs} s; bare {bare_runs} s; ratio {ratio_runs}"),
    };
    Ok(row)
}

async fn ours(
    cli: &Cli,
    ar: &kube::api::ApiResource,
    manifest: Value,
    pod_groups: usize,
) -> Res<(Row, Vec<Value>)> {
    let cluster = support::private_cluster();
    let client = cluster.client().await;
    let concurrency = format!("--concurrency={}", cli.concurrency);
    let mut ctl = controller::start(&cluster, None, &[&concurrency]);
    let ns = support::test_namespace(
        &client,
        "bench-kinds",
        &[("podgroup-sync.io/enabled", "true")],
    )
    .await;
    let pgs = jobs::api(&client, &ns, &Backend::SchedulerPlugins.ar());
    let writes = |c: &controller::Controller| c.metric("podgroup_sync_podgroup_writes_total", &[]);
    let (writes0, cpu0) = (writes(&ctl), cpu_seconds(ctl.child.id()));
    let start = Instant::now();
    let obj: DynamicObject = serde_json::from_value(manifest)?;
    jobs::api(&client, &ns, ar)
        .create(&PostParams::default(), &obj)
        .await?;
    // Polled: every 20 ms for a few PodGroups, every 100 ms for many (a list of 1,000 costs).
    let every = Duration::from_millis(if pod_groups <= 10 { 20 } else { 100 });
    let list = loop {
        let list = pgs.list(&ListParams::default()).await?.items;
        let sized = list.iter().all(|pg| pg.data["spec"]["minMember"].is_u64());
        if list.len() == pod_groups && sized {
            break list;
        }
        if start.elapsed() > Duration::from_secs(600) {
            return Err(format!("{} of {pod_groups} PodGroups after 600 s", list.len()).into());
        }
        tokio::time::sleep(every).await;
    };
    let ours_s = start.elapsed().as_secs_f64();
    let written = writes(&ctl) - writes0;
    let cpu_s = cpu_seconds(ctl.child.id()) - cpu0;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let writes_after_quiet = writes(&ctl) - writes0;
    let min_member = list
        .iter()
        .map(|pg| pg.data["spec"]["minMember"].as_u64().unwrap_or_default())
        .min()
        .unwrap_or_default();
    let rss_mib = proc_status(ctl.child.id()).0;
    // What the bare client creates: the same PodGroups, without what the server filled in.
    let wanted = list
        .into_iter()
        .map(|pg| {
            json!({"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
                "metadata": {"name": pg.metadata.name, "labels": pg.metadata.labels},
                "spec": pg.data["spec"]})
        })
        .collect();
    ctl.stop();
    support::stop_cluster(&cluster);
    let per = |w: f64| w / pod_groups as f64;
    let row = Row {
        kind: "",
        pod_groups,
        min_member,
        ours_s,
        bare_s: 0.0,
        writes: per(written),
        writes_after_quiet: per(writes_after_quiet),
        cpu_s,
        rss_mib,
        ratio: 0.0,
        runs: String::new(),
    };
    Ok((row, wanted))
}

/// The bare client: the same PodGroups applied directly as podgroup-sync applies them (forced
/// server-side apply, the same field manager), `--concurrency` in flight.
async fn bare(cli: &Cli, wanted: &[Value]) -> Res<f64> {
    let cluster = support::private_cluster();
    let client: Client = cluster.client().await;
    let ns = support::test_namespace(&client, "bench-kinds-bare", &[]).await;
    let pgs: Api<DynamicObject> = jobs::api(&client, &ns, &Backend::SchedulerPlugins.ar());
    // A warm connection, as podgroup-sync's is when the object comes.
    pgs.list(&ListParams::default().limit(1)).await?;
    let start = Instant::now();
    let results: Vec<_> = futures::stream::iter(wanted.iter().cloned())
        .map(|pg| {
            let pgs = pgs.clone();
            async move {
                let name = pg["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                let params = PatchParams::apply("podgroup-sync").force();
                pgs.patch(&name, &params, &Patch::Apply(&pg)).await?;
                Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
            }
        })
        .buffer_unordered(cli.concurrency)
        .collect()
        .await;
    let seconds = start.elapsed().as_secs_f64();
    support::stop_cluster(&cluster);
    results.into_iter().collect::<Result<Vec<()>, _>>()?;
    Ok(seconds)
}

/// One run's ratio to the bare client (NaN without it).
fn run_ratio(r: &Row) -> f64 {
    if r.bare_s.is_finite() {
        r.ours_s / r.bare_s.max(1e-3)
    } else {
        f64::NAN
    }
}

/// The ratio to the bare client; none for a single PodGroup, whose floor is one request.
fn ratio(r: &Row) -> String {
    if r.pod_groups > 1 && r.ratio.is_finite() {
        format!("{:.2}×", r.ratio)
    } else {
        "—".into()
    }
}

fn report(cli: &Cli, rows: &[Row], load: &str, took: Duration) -> String {
    let mut md = format!(
        "# The any-workload kinds' cost (SPEC §11)\n\n\
         `cargo bench --bench kinds -- --groups {} --jobs {} --concurrency {} --repeat {}` ({:.0} s; load \
         average before: {load}). Each contender on a fresh control plane \
         (`tests/cluster/start.sh`, the workload CRDs installed); no LWS or JobSet controller \
         runs: podgroup-sync reads the objects as created. The bare client applies the same \
         PodGroups as podgroup-sync does (forced server-side apply), {} in flight.\n\n\
         | kind | PodGroups | minMember | podgroup-sync: created → all right | bare client | ratio | \
         writes per PodGroup | the same 5 s later | podgroup-sync CPU | RSS |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        cli.groups,
        cli.jobs,
        cli.concurrency,
        cli.repeat,
        took.as_secs_f64(),
        cli.concurrency,
    );
    for r in rows {
        md.push_str(&format!(
            "| {} | {} | {} | {:.2} s | {} | {} | {:.2} | {:.2} | {:.2} s | {:.1} MiB |\n",
            r.kind,
            r.pod_groups,
            r.min_member,
            r.ours_s,
            if r.bare_s.is_finite() {
                format!("{:.2} s", r.bare_s)
            } else {
                "—".into()
            },
            ratio(r),
            r.writes,
            r.writes_after_quiet,
            r.cpu_s,
            r.rss_mib,
        ));
    }
    md.push_str("\nMedians of the runs (writes: the highest); every run:\n\n");
    for r in rows {
        md.push_str(&format!("- {}: {}\n", r.kind, r.runs));
    }
    md.push_str(
        "\nA JobSet is one PodGroup however many Jobs it has: its row measures reading and \
         planning one large object (the bare client's single apply is the floor). podgroup-sync's \
         time includes noticing the object through its watch; the PodGroup list is polled every \
         20 ms for one PodGroup, 100 ms for many.\n",
    );
    md
}

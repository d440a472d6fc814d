//! Issue 15: the benchmark as a matrix — every contender `--repeat` times at `--jobs` (the
//! robust ratios: median and spread; the steady state), then once at each `--growth` size. Each
//! run is a whole single run (fresh control planes, its own RESULTS.md in a subdirectory); this
//! module runs them and writes the top-level RESULTS.md, matrix.json and growth.csv.

use std::fmt::Write as _;
use std::path::Path;

use serde::Serialize;

use crate::*;

/// One run of the matrix.
#[derive(Serialize)]
pub(crate) struct MatrixRun {
    pub(crate) jobs: usize,
    pub(crate) namespaces: usize,
    pub(crate) rep: usize,
    pub(crate) dir: String,
    pub(crate) phases: Vec<Phase>,
    pub(crate) failures: Vec<String>,
    pub(crate) to_status: String,
}

impl MatrixRun {
    fn phase(&self, name: &str) -> Option<&Phase> {
        self.phases.iter().find(|p| p.name == name)
    }
}

/// The sizes to run: (jobs, namespaces, runs).
fn sizes(cli: &Cli) -> Res<Vec<(usize, usize, usize)>> {
    let mut out = vec![(cli.jobs, cli.namespaces, cli.repeat.max(1))];
    for g in &cli.growth {
        let (j, n) = g
            .split_once(':')
            .ok_or_else(|| err(format!("--growth {g}: expected JOBS:NAMESPACES")))?;
        let parse = |s: &str| {
            s.trim()
                .parse::<usize>()
                .map_err(|e| err(format!("--growth {g}: {e}")))
        };
        out.push((parse(j)?, parse(n)?, 1));
    }
    Ok(out)
}

/// Runs the matrix; each run writes its own directory under `out`.
pub(crate) async fn matrix(cli: Cli, out: &Path) -> Res<Vec<MatrixRun>> {
    let mut runs = Vec::new();
    let plan = sizes(&cli)?;
    let to_sizes = if cli.to_sizes.is_empty() {
        plan.iter().map(|s| s.0).filter(|j| *j <= 5000).collect()
    } else {
        cli.to_sizes.clone()
    };
    for (jobs, namespaces, reps) in plan {
        for rep in 1..=reps {
            let dir = out.join(format!("{jobs}-run{rep}"));
            let mut c = cli.clone();
            c.jobs = jobs;
            c.namespaces = namespaces;
            c.out = Some(dir.clone());
            c.repeat = 1;
            c.growth.clear();
            c.skip_training_operator |= !to_sizes.contains(&jobs) || rep > cli.to_runs;
            // The steady state runs into the cluster of the ratio size only.
            if jobs != cli.jobs {
                c.steady_seconds = 0;
            }
            log!("matrix: {jobs} jobs over {namespaces} namespaces, run {rep} of {reps}");
            let b = run(c).await?;
            runs.push(MatrixRun {
                jobs,
                namespaces,
                rep,
                dir: dir
                    .file_name()
                    .map(|f| f.to_string_lossy().into_owned())
                    .unwrap_or_default(),
                phases: b.phases,
                failures: b.failures,
                to_status: b.to_status,
            });
        }
    }
    Ok(runs)
}

/// Median and the spread (min, max) of some figures.
fn stats(mut v: Vec<f64>) -> Option<(f64, f64, f64)> {
    v.retain(|x| x.is_finite());
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    let median = if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    };
    Some((median, v[0], v[n - 1]))
}

fn show(s: Option<(f64, f64, f64)>, digits: usize) -> String {
    match s {
        Some((m, lo, hi)) => format!("**{m:.digits$}** ({lo:.digits$}–{hi:.digits$})"),
        None => "—".into(),
    }
}

/// A figure of one phase over the runs at one size.
fn figure(
    runs: &[MatrixRun],
    jobs: usize,
    phase: &str,
    f: impl Fn(&Phase) -> Option<f64>,
) -> Vec<f64> {
    runs.iter()
        .filter(|r| r.jobs == jobs)
        .filter_map(|r| r.phase(phase).and_then(&f))
        .collect()
}

/// How many runs at one size measured the phase.
fn measured(runs: &[MatrixRun], jobs: usize, phase: &str) -> usize {
    runs.iter()
        .filter(|r| r.jobs == jobs && r.phase(phase).is_some())
        .count()
}

/// Least squares y = a + b·x and r².
fn fit(points: &[(f64, f64)]) -> Option<(f64, f64, f64)> {
    let n = points.len() as f64;
    if points.len() < 2 {
        return None;
    }
    let (sx, sy) = points
        .iter()
        .fold((0.0, 0.0), |(a, b), (x, y)| (a + x, b + y));
    let (mx, my) = (sx / n, sy / n);
    let sxx: f64 = points.iter().map(|(x, _)| (x - mx).powi(2)).sum();
    let sxy: f64 = points.iter().map(|(x, y)| (x - mx) * (y - my)).sum();
    let syy: f64 = points.iter().map(|(_, y)| (y - my).powi(2)).sum();
    if sxx == 0.0 {
        return None;
    }
    let b = sxy / sxx;
    let r2 = if syy == 0.0 {
        1.0
    } else {
        sxy * sxy / (sxx * syy)
    };
    Some((my - b * mx, b, r2))
}

fn converge(p: &Phase) -> Option<f64> {
    p.converge_s
}
fn p99(p: &Phase) -> Option<f64> {
    p.latency.as_ref().map(|l| l.p99_ms)
}
fn p50(p: &Phase) -> Option<f64> {
    p.latency.as_ref().map(|l| l.p50_ms)
}
fn hwm(p: &Phase) -> Option<f64> {
    p.process.map(|s| s.hwm_mib)
}

/// Per-run ratios of one figure, ours over bare, at one size (runs paired by their number).
fn ratios(
    runs: &[MatrixRun],
    jobs: usize,
    ours: &str,
    bare: &str,
    f: fn(&Phase) -> Option<f64>,
) -> Vec<f64> {
    runs.iter()
        .filter(|r| r.jobs == jobs)
        .filter_map(|r| Some(f(r.phase(ours)?)? / f(r.phase(bare)?)?))
        .collect()
}

/// The top-level report: robust ratios, steady state, growth, correctness at every size.
pub(crate) fn write_matrix(
    cli: &Cli,
    out: &Path,
    runs: &[MatrixRun],
    load_start: &str,
    load_end: &str,
    started: u64,
) -> Res<()> {
    let n = cli.jobs;
    let mut md = String::new();
    let _ = writeln!(
        md,
        "# Scale benchmark matrix: podgroup-sync vs the bare client vs training-operator\n\n\
         `cargo bench --bench scale -- --jobs {n} --namespaces {} --repeat {} --steady-seconds {} --steady-rate {} --growth {}` \
         (bench/run.sh); started unix {started}. Every run on fresh control planes (etcd, kube-apiserver, \
         kube-controller-manager v1.34.4), one after another; each run's own RESULTS.md is in its \
         directory below. Medians with the spread (min–max) in brackets.\n",
        cli.namespaces,
        cli.repeat,
        cli.steady_seconds,
        cli.steady_rate,
        cli.growth.join(",")
    );
    let _ = writeln!(
        md,
        "Machine load average (1/5/15 min): {load_start} at the start, {load_end} at the end \
         (the benchmark's own processes keep it near 2 on this 2-core machine; each run's \
         RESULTS.md has its own).\n"
    );
    ratios_section(&mut md, runs, n);
    steady_section(&mut md, runs, n);
    growth_section(&mut md, out, runs)?;
    correctness_section(&mut md, runs);
    let _ = writeln!(md, "\n## Runs\n");
    for r in runs {
        let _ = writeln!(
            md,
            "- `{}`: {} jobs over {} namespaces{}{}",
            r.dir,
            r.jobs,
            r.namespaces,
            if r.failures.is_empty() {
                String::new()
            } else {
                format!("; FAILURES: {:?}", r.failures)
            },
            if r.to_status.is_empty() {
                String::new()
            } else {
                format!("; training-operator: {}", r.to_status)
            }
        );
    }
    std::fs::write(out.join("RESULTS.md"), md)?;
    std::fs::write(
        out.join("matrix.json"),
        serde_json::to_string_pretty(runs)? + "\n",
    )?;
    Ok(())
}

fn ratios_section(md: &mut String, runs: &[MatrixRun], n: usize) {
    let reps = runs.iter().filter(|r| r.jobs == n).count();
    let to_reps = measured(runs, n, "training-operator-burst");
    let _ = writeln!(
        md,
        "## Robust ratios at {n} jobs ({reps} runs of podgroup-sync and the bare client, {to_reps} of training-operator)\n\n\
         | | podgroup-sync | bare client (limit) | training-operator | podgroup-sync / bare (median of per-run ratios) | target |\n|---|---|---|---|---|---|"
    );
    let row = |md: &mut String,
               what: &str,
               ours: &str,
               bare: &str,
               to: Option<&str>,
               f: fn(&Phase) -> Option<f64>,
               digits: usize,
               target: &str| {
        let _ = writeln!(
            md,
            "| {what} | {} | {} | {} | {} | {target} |",
            show(stats(figure(runs, n, ours, f)), digits),
            show(stats(figure(runs, n, bare, f)), digits),
            to.map(|t| show(stats(figure(runs, n, t, f)), digits))
                .unwrap_or_else(|| "—".into()),
            show(stats(ratios(runs, n, ours, bare, f)), 2),
        );
    };
    row(
        md,
        "burst: every job has a correct PodGroup (s)",
        "podgroup-sync-burst",
        "bare-burst",
        Some("training-operator-burst"),
        converge,
        2,
        "≤ 1.10×",
    );
    row(
        md,
        "burst: job→PodGroup latency p99 (ms)",
        "podgroup-sync-burst",
        "bare-burst",
        Some("training-operator-burst"),
        p99,
        0,
        "≤ 1.5×",
    );
    row(
        md,
        "burst: job→PodGroup latency p50 (ms)",
        "podgroup-sync-burst",
        "bare-burst",
        Some("training-operator-burst"),
        p50,
        0,
        "",
    );
    row(
        md,
        "burst: order kept (rank correlation, created → PodGroup; 1 = FIFO)",
        "podgroup-sync-burst",
        "bare-burst",
        Some("training-operator-burst"),
        |p| p.order,
        3,
        "",
    );
    row(
        md,
        "backlog: every job has a correct PodGroup (s; ours from spawn)",
        "podgroup-sync-backlog",
        "bare-backlog",
        None,
        converge,
        2,
        "≤ 1.10×",
    );
    row(
        md,
        "backlog: … podgroup-sync from /readyz (its caches synced)",
        "podgroup-sync-backlog",
        "bare-backlog",
        None,
        |p| {
            p.extra
                .get("converge_after_ready_s")
                .and_then(|v| v.as_f64())
                .or(p.converge_s)
        },
        2,
        "",
    );
    let share = |p: &Phase| {
        let apiserver = p.extra.get("apiserver_cpu_s").and_then(|v| v.as_f64())?;
        Some(p.cpu_s? / apiserver * 100.0)
    };
    let apiserver = |p: &Phase| p.extra.get("apiserver_cpu_s").and_then(|v| v.as_f64());
    let _ = writeln!(
        md,
        "| burst: kube-apiserver CPU in the window (s) | {} | {} | — | — | |",
        show(stats(figure(runs, n, "podgroup-sync-burst", apiserver)), 2),
        show(stats(figure(runs, n, "bare-burst", apiserver)), 2)
    );
    let _ = writeln!(
        md,
        "| burst: podgroup-sync CPU as a share of kube-apiserver's in the same window (%) | {} | — | — | — | ≤ 5 % |",
        show(stats(figure(runs, n, "podgroup-sync-burst", share)), 1)
    );
    let _ = writeln!(
        md,
        "| restart with nothing changed: spawn → every job reconciled (s) | {} | — | — | — | |",
        show(
            stats(figure(runs, n, "podgroup-sync-restart", |p| p
                .extra
                .get("all_reconciled_s")
                .and_then(|v| v.as_f64()))),
            2
        )
    );
    let _ = writeln!(md);
}

fn steady_section(md: &mut String, runs: &[MatrixRun], n: usize) {
    if figure(runs, n, "podgroup-sync-steady", p99).is_empty() {
        return;
    }
    let _ = writeln!(
        md,
        "## Steady state: jobs at a constant rate into a cluster holding {n} jobs\n\n\
         Latency from the job's create response to its PodGroup first seen correct by a watch; the \
         bare client applies the PodGroup right after the create response.\n\n\
         | | podgroup-sync | bare client | target |\n|---|---|---|---|"
    );
    for (what, f, target) in [
        ("p50 (ms)", p50 as fn(&Phase) -> Option<f64>, ""),
        ("p99 (ms)", p99, "ours ≤ 100 and ≤ bare + 50"),
        (
            "max (ms)",
            (|p: &Phase| p.latency.as_ref().map(|l| l.max_ms)) as fn(&Phase) -> Option<f64>,
            "",
        ),
    ] {
        let _ = writeln!(
            md,
            "| {what} | {} | {} | {target} |",
            show(stats(figure(runs, n, "podgroup-sync-steady", f)), 1),
            show(stats(figure(runs, n, "bare-steady", f)), 1)
        );
    }
    let _ = writeln!(
        md,
        "| podgroup-sync CPU in the phase (s) | {} | — | |\n",
        show(
            stats(figure(runs, n, "podgroup-sync-steady", |p| p.cpu_s)),
            2
        )
    );
}

/// One row per size and contender: medians over the runs at that size.
#[derive(Serialize)]
struct GrowthRow {
    jobs: usize,
    contender: &'static str,
    converge_s: Option<f64>,
    hwm_mib: Option<f64>,
    cpu_s: Option<f64>,
}

fn growth_rows(runs: &[MatrixRun]) -> Vec<GrowthRow> {
    let mut sizes: Vec<usize> = runs.iter().map(|r| r.jobs).collect();
    sizes.sort();
    sizes.dedup();
    let med = |v: Vec<f64>| stats(v).map(|s| s.0);
    let mut rows = Vec::new();
    for j in sizes {
        for (contender, phase) in [
            ("podgroup-sync", "podgroup-sync-burst"),
            ("bare client", "bare-burst"),
            ("training-operator", "training-operator-burst"),
        ] {
            let conv = med(figure(runs, j, phase, converge));
            if conv.is_none() && measured(runs, j, phase) == 0 {
                continue;
            }
            rows.push(GrowthRow {
                jobs: j,
                contender,
                converge_s: conv,
                hwm_mib: med(figure(runs, j, phase, hwm)),
                cpu_s: med(figure(runs, j, phase, |p| p.cpu_s)),
            });
        }
    }
    rows
}

fn growth_section(md: &mut String, out: &Path, runs: &[MatrixRun]) -> Res<()> {
    let rows = growth_rows(runs);
    let mut csv = String::from("jobs,contender,converge_s,hwm_mib,cpu_s\n");
    let o = |x: Option<f64>| x.map(|v| format!("{v}")).unwrap_or_default();
    for r in &rows {
        let _ = writeln!(
            csv,
            "{},{},{},{},{}",
            r.jobs,
            r.contender,
            o(r.converge_s),
            o(r.hwm_mib),
            o(r.cpu_s)
        );
    }
    std::fs::write(out.join("growth.csv"), csv)?;
    let _ = writeln!(
        md,
        "## Growth: burst at every size (plot: growth.png)\n\n\
         RSS is the contender's peak (VmHWM) at the end of the burst window; CPU is user+system \
         seconds in the window (training-operator: until its last PodGroup). The bare client runs \
         inside the benchmark process, so it has no RSS or CPU of its own.\n\n\
         | jobs | contender | converge (s) | RSS (MiB) | KiB per job | CPU (s) | CPU ms per job |\n|---|---|---|---|---|---|---|"
    );
    let d = |x: Option<f64>, k: usize| x.map(|v| format!("{v:.k$}")).unwrap_or_else(|| "—".into());
    for r in &rows {
        let per = |x: Option<f64>, scale: f64| x.map(|v| v * scale / r.jobs as f64);
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} |",
            r.jobs,
            r.contender,
            d(r.converge_s, 2),
            d(r.hwm_mib, 1),
            d(per(r.hwm_mib, 1024.0), 1),
            d(r.cpu_s, 2),
            d(per(r.cpu_s, 1000.0), 3)
        );
    }
    let ours: Vec<&GrowthRow> = rows
        .iter()
        .filter(|r| r.contender == "podgroup-sync")
        .collect();
    let pts = |f: fn(&GrowthRow) -> Option<f64>| -> Vec<(f64, f64)> {
        ours.iter()
            .filter_map(|r| Some((r.jobs as f64, f(r)?)))
            .collect()
    };
    let _ = writeln!(md);
    for (what, f, unit, scale) in [
        (
            "convergence",
            (|r: &GrowthRow| r.converge_s) as fn(&GrowthRow) -> Option<f64>,
            "ms per job",
            1000.0,
        ),
        ("RSS", |r: &GrowthRow| r.hwm_mib, "KiB per job", 1024.0),
        ("CPU", |r: &GrowthRow| r.cpu_s, "ms per job", 1000.0),
    ] {
        if let Some((a, b, r2)) = fit(&pts(f)) {
            let _ = writeln!(
                md,
                "- podgroup-sync {what}, least-squares fit over the sizes: {:.3} + {:.4} {unit} × jobs (r² = {r2:.4}; intercept in {})",
                a,
                b * scale,
                if what == "RSS" { "MiB" } else { "s" }
            );
        }
    }
    let _ = writeln!(md);
    Ok(())
}

fn correctness_section(md: &mut String, runs: &[MatrixRun]) {
    let _ = writeln!(
        md,
        "## Correctness at every size\n\n| run | PodGroup writes per job (burst) | writes on restart | backlog writes per job |\n|---|---|---|---|"
    );
    for r in runs {
        let w = |name: &str, f: fn(&Phase) -> f64| {
            r.phase(name)
                .map(|p| format!("{:.3}", f(p)))
                .unwrap_or_else(|| "—".into())
        };
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} |",
            r.dir,
            w("podgroup-sync-burst", |p| p.podgroup_writes_per_job),
            w("podgroup-sync-restart", |p| p.podgroup_writes),
            w("podgroup-sync-backlog", |p| p.podgroup_writes_per_job),
        );
    }
}

//! The report: per-job CSVs, curves, the summary JSON and Markdown.

use std::collections::{BTreeMap, HashSet};
use std::fmt::Write as _;

use serde::Serialize;
use serde_json::Value;

use crate::*;

pub(crate) fn f(x: Option<f64>, digits: usize) -> String {
    match x {
        Some(v) if v.is_finite() => format!("{v:.digits$}"),
        _ => "—".into(),
    }
}

pub(crate) fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    }
}

pub(crate) fn machine() -> BTreeMap<String, String> {
    let mut m = BTreeMap::new();
    m.insert(
        "cpu".into(),
        sh("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'"),
    );
    m.insert("cores".into(), sh("nproc"));
    m.insert(
        "memory".into(),
        sh("awk '/MemTotal/ {printf \"%.1f GiB\", $2/1048576}' /proc/meminfo"),
    );
    m.insert("kernel".into(), sh("uname -sr"));
    m.insert("rustc".into(), sh("rustc --version"));
    m.insert(
        "commit".into(),
        sh(&format!(
            "cd '{}' && git rev-parse --short HEAD && (git status --porcelain src Cargo.lock | grep -q . && echo '(src modified)' || true)",
            root().display()
        ))
        .replace('\n', " "),
    );
    m
}

/// Everything a run found, from which both summary.json and RESULTS.md are written.
#[derive(Debug, Serialize)]
pub(crate) struct Summary {
    pub(crate) jobs: usize,
    pub(crate) namespaces: usize,
    pub(crate) concurrency: u16,
    pub(crate) creators: usize,
    pub(crate) controller_args: Vec<String>,
    pub(crate) controller_env: Vec<String>,
    pub(crate) skip_training_operator: bool,
    pub(crate) training_operator: TrainingOperatorRun,
    pub(crate) started_unix: u64,
    pub(crate) machine: BTreeMap<String, String>,
    pub(crate) apiserver: String,
    pub(crate) load_start: String,
    pub(crate) load_end: String,
    /// The spec podgroup-sync gives every benchmark job.
    pub(crate) podgroup_sync_spec: Value,
    pub(crate) goals: Vec<Goal>,
    pub(crate) phases: Vec<Phase>,
    pub(crate) notes: Vec<String>,
    pub(crate) failures: Vec<String>,
}

#[derive(Debug, Serialize)]
pub(crate) struct TrainingOperatorRun {
    pub(crate) status: String,
    pub(crate) flags: Vec<String>,
}

/// One goal of issue 7.
#[derive(Debug, Serialize)]
pub(crate) struct Goal {
    pub(crate) goal: String,
    pub(crate) measured: String,
    pub(crate) verdict: &'static str,
}

impl Goal {
    fn new(goal: impl Into<String>, measured: String, ok: Option<bool>) -> Goal {
        let verdict = match ok {
            Some(true) => "met",
            Some(false) => "**not met**",
            None => "not measured",
        };
        Goal {
            goal: goal.into(),
            measured,
            verdict,
        }
    }
}

impl Summary {
    pub(crate) fn of(
        b: &Bench,
        machine: BTreeMap<String, String>,
        load_start: &str,
        load_end: &str,
        started: u64,
    ) -> Summary {
        let cli = &b.cli;
        let mut s = Summary {
            jobs: cli.jobs,
            namespaces: cli.namespaces,
            concurrency: cli.concurrency,
            creators: cli.creators,
            controller_args: cli.controller_args.clone(),
            controller_env: cli.controller_env.clone(),
            skip_training_operator: cli.skip_training_operator,
            training_operator: TrainingOperatorRun {
                status: b.to_status.clone(),
                flags: b.to_flags.clone(),
            },
            started_unix: started,
            machine,
            apiserver: b.apiserver.clone(),
            load_start: load_start.into(),
            load_end: load_end.into(),
            podgroup_sync_spec: desired_pod_group("a", "a", "a")
                .map(|d| d["spec"].clone())
                .unwrap_or(Value::Null),
            goals: Vec::new(),
            phases: b.phases.clone(),
            notes: b.notes.clone(),
            failures: b.failures.clone(),
        };
        s.goals = goals(&s);
        s
    }

    pub(crate) fn phase(&self, name: &str) -> Option<&Phase> {
        self.phases.iter().find(|p| p.name == name)
    }
}

/// Writes the per-job CSVs, curves.csv, RESULTS.md and summary.json of a run.
pub(crate) fn write_outputs(
    b: &Bench,
    machine: BTreeMap<String, String>,
    load_start: &str,
    load_end: &str,
    started: u64,
) -> Res<()> {
    write_curves(b)?;
    let summary = Summary::of(b, machine, load_start, load_end, started);
    std::fs::write(b.out.join("RESULTS.md"), markdown(&summary))?;
    std::fs::write(
        b.out.join("summary.json"),
        serde_json::to_string_pretty(&summary)? + "\n",
    )?;
    Ok(())
}

/// The per-job CSVs and the downsampled curves the plot is drawn from.
fn write_curves(b: &Bench) -> Res<()> {
    // per-job CSVs and the downsampled curves
    let mut curves = String::from("phase,series,x,y\n");
    for p in &b.phases {
        if p.per_job.is_empty() {
            continue;
        }
        let mut csv = String::from("job,created_s,podgroup_s\n");
        for (k, c, s) in &p.per_job {
            let _ = writeln!(csv, "{k},{c:.4},{s:.4}");
        }
        std::fs::write(b.out.join(format!("{}.jobs.csv", p.name)), csv)?;
        let mut pg: Vec<f64> = p.per_job.iter().map(|r| r.2).collect();
        pg.sort_by(f64::total_cmp);
        let mut cr: Vec<f64> = p.per_job.iter().map(|r| r.1).collect();
        cr.sort_by(f64::total_cmp);
        let mut lat: Vec<f64> = p.per_job.iter().map(|r| (r.2 - r.1) * 1000.0).collect();
        lat.sort_by(f64::total_cmp);
        let step = (pg.len() / 200).max(1);
        let idx: Vec<usize> = (0..pg.len())
            .step_by(step)
            .chain(std::iter::once(pg.len() - 1))
            .collect();
        for &i in &idx {
            let _ = writeln!(curves, "{},podgroups,{:.3},{}", p.name, pg[i], i + 1);
        }
        if p.name.ends_with("burst") {
            for &i in &idx {
                let _ = writeln!(curves, "{},jobs,{:.3},{}", p.name, cr[i], i + 1);
            }
            for &i in &idx {
                let _ = writeln!(
                    curves,
                    "{},latency_ms,{:.1},{:.4}",
                    p.name,
                    lat[i],
                    (i + 1) as f64 / lat.len() as f64
                );
            }
        }
    }
    std::fs::write(b.out.join("curves.csv"), curves)?;
    Ok(())
}

/// The goals of issue 7, each with what was measured and a verdict.
fn goals(s: &Summary) -> Vec<Goal> {
    let bare = s.phase("bare-burst");
    let bare_b = s.phase("bare-backlog");
    let pgs = s.phase("podgroup-sync-burst");
    let restart = s.phase("podgroup-sync-restart");
    let pgs_b = s.phase("podgroup-sync-backlog");
    let to = s.phase("training-operator-burst");
    let to_hwm_end = to_hwm_at_end(to);

    let mut goals = Vec::new();
    let r_bare = ratio(conv(pgs), conv(bare));
    goals.push(Goal::new(
        "converge ≤ 1.2× the bare client (burst)".to_string(),
        format!(
            "{} s vs {} s = {}×",
            f(conv(pgs), 2),
            f(conv(bare), 2),
            f(r_bare, 2)
        ),
        r_bare.map(|r| r <= 1.2),
    ));
    let r_bare_b = ratio(conv(pgs_b), conv(bare_b));
    goals.push(Goal::new(
        "(backlog: N jobs without PodGroups, controller started) ≤ 1.2× the bare client",
        format!(
            "{} s (from spawn) vs {} s = {}×",
            f(conv(pgs_b), 2),
            f(conv(bare_b), 2),
            f(r_bare_b, 2)
        ),
        r_bare_b.map(|r| r <= 1.2),
    ));
    let r_to = ratio(conv(pgs), conv(to));
    goals.push(Goal::new(
        "converge ≤ 0.5× training-operator".to_string(),
        format!(
            "{} s vs {} s = {}×",
            f(conv(pgs), 2),
            f(conv(to), 2),
            f(r_to, 2)
        ),
        r_to.map(|r| r <= 0.5),
    ));
    let r_rss = ratio(hwm(pgs), to_hwm_end);
    goals.push(Goal::new(
        "peak RSS ≤ 0.5× training-operator's".to_string(),
        format!(
            "{} MiB vs {} MiB = {}×",
            f(hwm(pgs), 1),
            f(to_hwm_end, 1),
            f(r_rss, 2)
        ),
        r_rss.map(|r| r <= 0.5),
    ));
    let w = pgs.map(|p| p.podgroup_writes_per_job);
    goals.push(Goal::new(
        "1 PodGroup write per job on creation".to_string(),
        format!("{} per job", f(w, 3)),
        w.map(|w| (w - 1.0).abs() < 1e-9),
    ));
    let rw = restart.map(|p| p.podgroup_writes);
    goals.push(Goal::new(
        "0 PodGroup writes on restart / resync".to_string(),
        f(rw, 0),
        rw.map(|w| w == 0.0),
    ));

    goals
}

/// RESULTS.md, written from the summary alone.
/// RESULTS.md, written from the summary alone.
fn markdown(s: &Summary) -> String {
    let mut md = String::new();
    md_header_and_goals(s, &mut md);
    md_burst(s, &mut md);
    md_backlog(s, &mut md);
    md_restart(s, &mut md);
    md_requests(s, &mut md);
    md_machine_and_notes(s, &mut md);
    md
}

/// The title, what was run, and the goals.
fn md_header_and_goals(s: &Summary, md: &mut String) {
    let (n, m) = (s.jobs, s.namespaces);
    let _ = writeln!(
        md,
        "# Scale benchmark: podgroup-sync vs the bare client vs training-operator\n"
    );
    let _ = writeln!(
        md,
        "{n} PyTorchJobs (Master 1 + Worker 3, every template labelled `{POD_GROUP_LABEL}: <job>`) across {m} namespaces, created at once ({} creates in flight); controller `--concurrency={}`{}. Each contender on a fresh control plane (etcd 3.6.5, kube-apiserver and kube-controller-manager v1.34.4, `tests/cluster/start.sh`), one after another, same machine.\n",
        s.creators,
        s.concurrency,
        if s.controller_args.is_empty() && s.controller_env.is_empty() {
            String::new()
        } else {
            format!(
                " plus `{}`",
                s.controller_env
                    .iter()
                    .chain(&s.controller_args)
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(" ")
            )
        }
    );
    let _ = writeln!(
        md,
        "Generated by `cargo bench --bench scale -- --jobs {n} --namespaces {m} --concurrency {}{}` (bench/run.sh); started {} (unix {}).\n",
        s.concurrency,
        if s.skip_training_operator {
            " --skip-training-operator"
        } else {
            ""
        },
        sh(&format!(
            "date -u -d @{} '+%Y-%m-%d %H:%M UTC'",
            s.started_unix
        )),
        s.started_unix
    );
    let _ = writeln!(
        md,
        "## Goals (issue 7)\n\n| goal | measured | |\n|---|---|---|"
    );
    for g in &s.goals {
        let _ = writeln!(md, "| {} | {} | {} |", g.goal, g.measured, g.verdict);
    }
}

/// The burst: every contender side by side.
fn md_burst(s: &Summary, md: &mut String) {
    let n = s.jobs;
    let pgs = s.phase("podgroup-sync-burst");
    let bare = s.phase("bare-burst");
    let to = s.phase("training-operator-burst");
    let to_hwm_end = to_hwm_at_end(to);
    let _ = writeln!(md, "\n## Burst: {n} jobs created at once\n");
    let _ = writeln!(
        md,
        "| | podgroup-sync | bare client (limit) | training-operator |\n|---|---|---|---|"
    );
    let cols = [pgs, bare, to];
    let row = |md: &mut String, label: &str, g: &dyn Fn(&Phase) -> String| {
        let cells: Vec<String> = cols
            .iter()
            .map(|p| p.map(g).unwrap_or_else(|| "—".into()))
            .collect();
        let _ = writeln!(md, "| {label} | {} |", cells.join(" | "));
    };
    row(md, "all jobs created (s after the first create)", &|p| {
        f(p.create_s, 2)
    });
    row(md, "**every job has a correct PodGroup (s)**", &|p| {
        if p.converged {
            format!("**{}**", f(p.converge_s, 2))
        } else {
            format!("not converged ({} of {})", p.correct, p.jobs)
        }
    });
    row(md, "… after the last job was created (s)", &|p| {
        f(p.tail_s, 2)
    });
    row(
        md,
        "job→PodGroup latency p50 / p90 / p99 / max (ms; create response → watch)",
        &|p| {
            p.latency
                .as_ref()
                .map(|l| {
                    format!(
                        "{:.0} / {:.0} / {:.0} / {:.0}",
                        l.p50_ms, l.p90_ms, l.p99_ms, l.max_ms
                    )
                })
                .unwrap_or_else(|| "—".into())
        },
    );
    row(
        md,
        "order kept: rank correlation, job created → PodGroup seen (1 = first in, first out)",
        &|p| f(p.order, 3),
    );
    row(
        md,
        "creationTimestamp difference p50 / p99 (s, 1 s resolution)",
        &|p| {
            format!(
                "{} / {}",
                f(p.server_latency_p50_s, 0),
                f(p.server_latency_p99_s, 0)
            )
        },
    );
    row(md, "PodGroup writes per job (API server)", &|p| {
        f(Some(p.podgroup_writes_per_job), 3)
    });
    row(
        md,
        "API requests per job (all, minus the creator's job POSTs)",
        &|p| f(Some(p.requests_per_job), 2),
    );
    row(md, "writes per job (all kinds)", &|p| {
        f(Some(p.writes_per_job), 2)
    });
    row(md, "peak RSS (MiB, VmHWM)", &|p| {
        if p.name.starts_with("training") {
            format!(
                "{} at PodGroups, {} at the end",
                f(p.process.map(|s| s.hwm_mib), 1),
                f(to_hwm_end, 1)
            )
        } else {
            f(p.process.map(|s| s.hwm_mib), 1)
        }
    });
    row(md, "CPU seconds (utime+stime) in the window", &|p| {
        if p.name.starts_with("training") {
            format!(
                "{} at PodGroups, {} at the end",
                f(p.cpu_s, 1),
                f(p.extra.get("cpu_s_at_end").and_then(Value::as_f64), 1)
            )
        } else {
            f(p.cpu_s, 1)
        }
    });
    if let Some(t) = to {
        let _ = writeln!(
            md,
            "\ntraining-operator, beyond its PodGroups: {} pods and {} services created; all of them after {} s; then {} API requests and {} writes per job in total.",
            f(t.extra.get("pods_created").and_then(Value::as_f64), 0),
            f(t.extra.get("services_created").and_then(Value::as_f64), 0),
            f(
                t.extra
                    .get("all_pods_and_services_s")
                    .and_then(Value::as_f64),
                1
            ),
            f(
                t.extra.get("full_requests_per_job").and_then(Value::as_f64),
                2
            ),
            f(
                t.extra.get("full_writes_per_job").and_then(Value::as_f64),
                2
            ),
        );
        let _ = writeln!(
            md,
            "Its PodGroup spec: `{}` (podgroup-sync: `{}`).",
            t.extra
                .get("sample_podgroup_spec")
                .cloned()
                .unwrap_or(Value::Null),
            s.podgroup_sync_spec
        );
    }
    let _ = writeln!(
        md,
        "\ntraining-operator: {}; flags `{}`.",
        if s.training_operator.status.is_empty() {
            "not run"
        } else {
            &s.training_operator.status
        },
        s.training_operator.flags.join(" ")
    );
}

/// The backlog: jobs without PodGroups.
fn md_backlog(s: &Summary, md: &mut String) {
    let n = s.jobs;
    let bare_b = s.phase("bare-backlog");
    let pgs_b = s.phase("podgroup-sync-backlog");
    let _ = writeln!(
        md,
        "\n## Backlog: {n} jobs exist, no PodGroups\n\n| | podgroup-sync (started) | bare client |\n|---|---|---|"
    );
    let _ = writeln!(
        md,
        "| every job has a correct PodGroup (s) | {} from spawn ({} after /readyz at {} s) | {} from the first write |",
        f(conv(pgs_b), 2),
        f(
            pgs_b
                .and_then(|p| p.extra.get("converge_after_ready_s"))
                .and_then(Value::as_f64),
            2
        ),
        f(
            pgs_b
                .and_then(|p| p.extra.get("ready_s"))
                .and_then(Value::as_f64),
            2
        ),
        f(conv(bare_b), 2)
    );
    let _ = writeln!(
        md,
        "| PodGroup writes per job | {} | {} |",
        f(pgs_b.map(|p| p.podgroup_writes_per_job), 3),
        f(bare_b.map(|p| p.podgroup_writes_per_job), 3)
    );
    let _ = writeln!(
        md,
        "| API requests per job | {} | {} |",
        f(pgs_b.map(|p| p.requests_per_job), 2),
        f(bare_b.map(|p| p.requests_per_job), 2)
    );
    let _ = writeln!(
        md,
        "| peak RSS (MiB) / CPU s | {} / {} | — |",
        f(hwm(pgs_b), 1),
        f(pgs_b.and_then(|p| p.cpu_s), 1)
    );
}

/// The restart with nothing changed.
fn md_restart(s: &Summary, md: &mut String) {
    let n = s.jobs;
    let restart = s.phase("podgroup-sync-restart");
    if let Some(r) = restart {
        let g = |k: &str| r.extra.get(k).and_then(Value::as_f64);
        let _ = writeln!(
            md,
            "\n## Restart with nothing changed (steady state)\n\n| | podgroup-sync |\n|---|---|"
        );
        let _ = writeln!(md, "| SIGTERM → exit (s) | {} |", f(g("shutdown_s"), 2));
        let _ = writeln!(md, "| spawn → /readyz 200 (s) | {} |", f(g("ready_s"), 2));
        let _ = writeln!(
            md,
            "| spawn → `podgroup_sync_reconcile_total` ≥ {n} (s) | {} |",
            f(g("all_reconciled_s"), 2)
        );
        let _ = writeln!(
            md,
            "| reconciles (settled at {} s) | {} |",
            f(g("reconciles_settled_s"), 2),
            f(g("controller_reconciles"), 0)
        );
        let _ = writeln!(
            md,
            "| **PodGroup writes** (API server / controller's count) | **{}** / {} |",
            f(Some(r.podgroup_writes), 0),
            f(g("controller_podgroup_writes"), 0)
        );
        let _ = writeln!(md, "| Event writes | {} |", f(g("event_writes"), 0));
        let _ = writeln!(
            md,
            "| API requests (all) | {} |",
            f(Some(r.requests.values().sum()), 0)
        );
        let _ = writeln!(
            md,
            "| peak RSS (MiB) / CPU s | {} / {} |",
            f(hwm(Some(r)), 1),
            f(r.cpu_s, 1)
        );
    }
}

/// The API requests of every phase by verb and resource.
fn md_requests(s: &Summary, md: &mut String) {
    let n = s.jobs;
    let _ = writeln!(
        md,
        "\n## API requests by verb and resource (API server `apiserver_request_total` deltas)\n"
    );
    let names: Vec<&Phase> = s.phases.iter().collect();
    let mut keys: Vec<String> = names
        .iter()
        .flat_map(|p| p.requests.keys().cloned())
        .collect::<HashSet<_>>()
        .into_iter()
        .collect();
    keys.sort();
    let _ = writeln!(
        md,
        "| request | {} |\n|---|{}",
        names
            .iter()
            .map(|p| p.name.as_str())
            .collect::<Vec<_>>()
            .join(" | "),
        "---|".repeat(names.len())
    );
    for k in &keys {
        let cells: Vec<String> = names
            .iter()
            .map(|p| {
                p.requests
                    .get(k)
                    .map(|v| format!("{v:.0}"))
                    .unwrap_or_default()
            })
            .collect();
        let _ = writeln!(md, "| `{k}` | {} |", cells.join(" | "));
    }
    let _ = writeln!(
        md,
        "\nEach window runs from just before the first request of the phase to 2 s after convergence (training-operator: until the PodGroups; its full window to the last pod is in summary.json). The counters are the whole API server's: the creator's job POSTs ({n} per burst) are subtracted from the per-job figures; kube-controller-manager's and the API server's own background (about 0.1 request/s: lease renewals, discovery) and the benchmark's PodGroup watch (one LIST, one WATCH per 290 s) are included. A WATCH is counted when it ends."
    );
}

/// The machine, notes and failures.
fn md_machine_and_notes(s: &Summary, md: &mut String) {
    let _ = writeln!(md, "\n## Machine\n\n| | |\n|---|---|");
    for (k, v) in &s.machine {
        let _ = writeln!(md, "| {k} | {v} |");
    }
    let _ = writeln!(
        md,
        "| control plane | {}, etcd 3.6.5 (tests/cluster/get-binaries.sh) |",
        s.apiserver
    );
    let _ = writeln!(
        md,
        "| load average (1/5/15 min) at start | {} |\n| load average at end | {} |",
        s.load_start, s.load_end
    );
    let _ = writeln!(
        md,
        "| other work on the machine | other engineers' builds and tests may run concurrently; see the load averages |"
    );
    if !s.notes.is_empty() {
        let _ = writeln!(md, "\n## Notes\n");
        for n in &s.notes {
            let _ = writeln!(md, "- {n}");
        }
    }
    if !s.failures.is_empty() {
        let _ = writeln!(md, "\n## FAILURES\n");
        for f in &s.failures {
            let _ = writeln!(md, "- {f}");
        }
    }
}

fn conv(p: Option<&Phase>) -> Option<f64> {
    p.and_then(|p| p.converge_s)
}

fn hwm(p: Option<&Phase>) -> Option<f64> {
    p.and_then(|p| p.process).map(|s| s.hwm_mib)
}

/// training-operator's peak RSS once it created every pod and service (it keeps growing after
/// its PodGroups).
fn to_hwm_at_end(to: Option<&Phase>) -> Option<f64> {
    to.and_then(|p| p.extra.get("process_at_end"))
        .and_then(|v| v.get("hwm_mib"))
        .and_then(Value::as_f64)
        .or(hwm(to))
}

//! One measured phase: its timing, requests and process figures.

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use serde::Serialize;
use serde_json::Value;

use crate::*;

#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct Latency {
    pub(crate) p50_ms: f64,
    pub(crate) p90_ms: f64,
    pub(crate) p99_ms: f64,
    pub(crate) max_ms: f64,
}

impl Latency {
    pub(crate) fn of(mut v: Vec<f64>) -> Latency {
        v.sort_by(f64::total_cmp);
        Latency {
            p50_ms: round(pct(&v, 50.0), 1),
            p90_ms: round(pct(&v, 90.0), 1),
            p99_ms: round(pct(&v, 99.0), 1),
            max_ms: round(v.last().copied().unwrap_or(f64::NAN), 1),
        }
    }
}

/// One measured phase.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct Phase {
    pub(crate) name: String,
    pub(crate) jobs: usize,
    /// Every job has a correct PodGroup.
    pub(crate) converged: bool,
    pub(crate) correct: usize,
    /// Start (first job create, process spawn or first write) → last job created.
    pub(crate) create_s: Option<f64>,
    /// Start → the last PodGroup seen correct by the watch.
    pub(crate) converge_s: Option<f64>,
    /// Last job created → last PodGroup seen correct.
    pub(crate) tail_s: Option<f64>,
    /// Create response of the job → its PodGroup first seen correct by the watch.
    pub(crate) latency: Option<Latency>,
    /// Spearman rank correlation of the order jobs were created and the order their PodGroups
    /// appeared (1: first in, first out); bursts only.
    pub(crate) order: Option<f64>,
    /// PodGroup creationTimestamp − job creationTimestamp (1 s resolution), p50 / p99, s.
    pub(crate) server_latency_p50_s: Option<f64>,
    pub(crate) server_latency_p99_s: Option<f64>,
    /// API server requests in the window, "VERB resource" → count; the benchmark's own scrapes
    /// of /metrics are left out.
    pub(crate) requests: BTreeMap<String, f64>,
    /// Requests the benchmark itself made in the window (job creates), left out of the per-job
    /// figures.
    pub(crate) bench_requests: f64,
    pub(crate) podgroup_writes: f64,
    pub(crate) podgroup_writes_per_job: f64,
    pub(crate) requests_per_job: f64,
    pub(crate) writes_per_job: f64,
    /// The contender's process (podgroup-sync, training-operator) at the end of the window.
    pub(crate) process: Option<ProcStats>,
    /// CPU seconds of the process during the window.
    pub(crate) cpu_s: Option<f64>,
    /// Phase-specific figures.
    pub(crate) extra: BTreeMap<String, Value>,
    /// Per job: seconds from the start to its create response and to its PodGroup seen correct.
    #[serde(skip)]
    pub(crate) per_job: Vec<(String, f64, f64)>,
    #[serde(skip)]
    pub(crate) window_len_s: f64,
}

impl Phase {
    pub(crate) fn new(name: &str, jobs: usize) -> Phase {
        Phase {
            name: name.into(),
            jobs,
            ..Phase::default()
        }
    }

    /// Fills the timing figures from the creator's records and the watch's.
    pub(crate) fn timing(
        &mut self,
        t0: Instant,
        created: &[Created],
        seen: &HashMap<String, Seen>,
        per_job_start: Option<Instant>,
    ) {
        self.correct = seen.len();
        self.converged = seen.len() >= self.jobs;
        let last_seen = seen.values().map(|s| s.at).max();
        let last_created = created.iter().map(|c| c.at).max();
        if let Some(l) = last_seen.filter(|_| self.converged) {
            self.converge_s = Some(secs(l.saturating_duration_since(t0)));
        }
        if let (Some(lc), Some(ls)) = (
            last_created.filter(|_| per_job_start.is_none()),
            last_seen.filter(|_| self.converged),
        ) {
            self.create_s = Some(secs(lc.saturating_duration_since(t0)));
            self.tail_s = Some(secs(ls.saturating_duration_since(lc)));
        }
        let mut lat = Vec::new();
        let mut server = Vec::new();
        for c in created {
            let Some(s) = seen.get(&c.key) else { continue };
            let from = per_job_start.unwrap_or(c.at);
            lat.push(s.at.saturating_duration_since(from).as_secs_f64() * 1000.0);
            if per_job_start.is_none()
                && let Some(pc) = s.created
            {
                server.push((pc - c.created) as f64);
            }
            self.per_job.push((
                c.key.clone(),
                if per_job_start.is_none() {
                    c.at.saturating_duration_since(t0).as_secs_f64()
                } else {
                    0.0
                },
                s.at.saturating_duration_since(t0).as_secs_f64(),
            ));
        }
        if !lat.is_empty() {
            self.latency = Some(Latency::of(lat));
        }
        if per_job_start.is_none() {
            let pairs: Vec<(f64, f64)> = self.per_job.iter().map(|(_, c, s)| (*c, *s)).collect();
            self.order = spearman(&pairs).map(|r| round(r, 3));
        }
        if !server.is_empty() {
            server.sort_by(f64::total_cmp);
            self.server_latency_p50_s = Some(pct(&server, 50.0));
            self.server_latency_p99_s = Some(pct(&server, 99.0));
        }
    }

    pub(crate) fn requests(&mut self, d: &Requests, bench_requests: f64) {
        let d = d.without_scrapes();
        let n = self.jobs.max(1) as f64;
        self.requests = d.by_verb_resource();
        self.bench_requests = bench_requests;
        self.podgroup_writes = d.podgroup_writes();
        self.podgroup_writes_per_job = round(self.podgroup_writes / n, 3);
        self.requests_per_job = round((d.total() - bench_requests) / n, 3);
        self.writes_per_job = round((d.writes() - bench_requests) / n, 3);
    }
}

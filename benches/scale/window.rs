//! The measuring skeleton every contender's phase runs in: the PodGroup watch armed for the
//! phase's jobs, the API server's request counters read, the clock started; at the end the
//! counters are read again and the phase's figures filled the same way for every contender.

use std::time::Instant;

use kube::Client;

use crate::*;

pub(crate) struct Window {
    pub(crate) name: &'static str,
    pub(crate) jobs: usize,
    before: Requests,
    /// The start of the phase (moved to the controller's spawn for a backlog).
    pub(crate) t0: Instant,
}

impl Window {
    /// Arms `watch` for the jobs named `prefix`… (each checked by `check`), reads the counters
    /// and starts the clock.
    pub(crate) async fn open(
        name: &'static str,
        jobs: usize,
        client: &Client,
        watch: &PgWatch,
        prefix: &str,
        check: &Check,
    ) -> Res<Window> {
        watch.begin(prefix, check.clone());
        Ok(Window {
            name,
            jobs,
            before: Requests::scrape(client).await?,
            t0: Instant::now(),
        })
    }

    /// The requests between the opening and `after`.
    pub(crate) fn since(&self, after: &Requests) -> Requests {
        after.since(&self.before)
    }

    /// Reads the counters again and fills the phase: timing from the creates and the watch (for
    /// a `backlog`, every job's latency counts from the start), requests less the benchmark's own
    /// `bench_posts`.
    pub(crate) async fn close(
        &self,
        client: &Client,
        created: &[Created],
        watch: &PgWatch,
        backlog: bool,
        bench_posts: f64,
    ) -> Res<Phase> {
        let after = Requests::scrape(client).await?;
        let mut p = Phase::new(self.name, self.jobs);
        p.timing(
            self.t0,
            created,
            &watch.records(),
            backlog.then_some(self.t0),
        );
        p.requests(&self.since(&after), bench_posts);
        p.window_len_s = self.t0.elapsed().as_secs_f64();
        Ok(p)
    }
}

impl Bench {
    /// Ends a phase the same way for every contender: a failure when not every PodGroup was
    /// correct in time or a verified one is wrong, a log line, the phase kept.
    pub(crate) fn conclude(&mut self, p: Phase, ok: bool, wrong: Vec<String>) {
        if !ok {
            self.fail(format!(
                "{}: {} of {} PodGroups correct within {:?}",
                p.name,
                p.correct,
                p.jobs,
                self.converge_timeout()
            ));
        }
        if !wrong.is_empty() {
            self.fail(format!("{}: wrong PodGroups: {wrong:?}", p.name));
        }
        log!(
            "{}: converged in {:?} s; {} PodGroup writes",
            p.name,
            p.converge_s,
            p.podgroup_writes
        );
        self.phases.push(p);
    }
}

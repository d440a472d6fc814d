//! Contender 2: podgroup-sync (burst, restart with nothing changed, backlog).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::*;

impl Bench {
    /// Phase 2: podgroup-sync.
    pub(crate) async fn podgroup_sync(&mut self) -> Res<()> {
        let m = self.cli.namespaces;
        let mut cp = ControlPlane::start(self.out.join("cp-podgroup-sync"))?;
        self.apiserver = sh(&format!("'{}/kube-apiserver' --version", cp.bin.display()));
        let client = cp.client().await?;
        create_namespaces(&client, "pgs", m, &[("podgroup-sync.io/enabled", "true")]).await?;
        let watch = PgWatch::start(&client).await?;
        let check = Check::exact()?;
        let ctx = PhaseCtx {
            cp: &cp,
            client: &client,
            watch: &watch,
            check: &check,
        };
        let (ctl, created) = self.pgs_burst(&ctx).await?;
        let ctl = self.pgs_restart(&ctx, ctl).await?;
        let mut ctl = self.pgs_backlog(&ctx, &created, ctl).await?;
        if self.cli.steady_seconds > 0 {
            self.pgs_steady(&ctx, &ctl).await?;
        }
        tokio::task::block_in_place(|| ctl.terminate(Duration::from_secs(30)));
        drop(watch);
        cp.stop();
        Ok(())
    }

    /// (a) burst: the controller runs, N jobs are created at once.
    async fn pgs_burst(&mut self, ctx: &PhaseCtx<'_>) -> Res<(Proc, Vec<Created>)> {
        let (n, m) = (self.cli.jobs, self.cli.namespaces);
        let PhaseCtx {
            cp,
            client,
            watch,
            check,
        } = *ctx;
        let mut ctl = spawn_controller(
            &self.cli,
            &self.controller_bin,
            cp,
            self.out.join("podgroup-sync-1.log"),
        )?;
        let ready = wait_ready(&mut ctl, Duration::from_secs(120)).await?;
        log!(
            "podgroup-sync ready in {:.2} s (pid {}); burst: {n} jobs, {} creates in flight",
            ready.as_secs_f64(),
            ctl.pid(),
            self.cli.creators
        );
        let w = Window::open("podgroup-sync-burst", n, client, watch, "pgs-", check).await?;
        let cpu0 = ctl.stats().cpu_s;
        let apiserver0 = cp.cpu_of("kube-apiserver");
        let posts = AtomicU64::new(0);
        let created = create_jobs(client, "pgs", n, m, self.cli.creators, None, &posts).await?;
        log!(
            "podgroup-sync, burst: {n} jobs created in {:.1} s; waiting for PodGroups",
            w.t0.elapsed().as_secs_f64()
        );
        let ok = watch.wait_correct(n, self.converge_timeout()).await;
        // Let trailing requests (the reconciles the PodGroup events trigger) land in the window.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let posts = posts.load(Ordering::Relaxed) as f64;
        let mut p = w.close(client, &created, watch, false, posts).await?;
        let stats = ctl.stats();
        let metrics = tokio::task::block_in_place(|| ctl.get("/metrics"))
            .map(|(_, b)| b)
            .unwrap_or_default();
        p.process = Some(stats);
        p.cpu_s = Some(round(stats.cpu_s - cpu0, 2));
        if let (Some(a0), Some(a1)) = (apiserver0, cp.cpu_of("kube-apiserver")) {
            p.extra
                .insert("apiserver_cpu_s".into(), json!(round(a1 - a0, 2)));
        }
        p.extra.insert("ready_s".into(), json!(secs(ready)));
        controller_counts(&mut p, &metrics);
        p.extra.insert(
            "controller_reconciles".into(),
            json!(metric_sum(&metrics, "podgroup_sync_reconcile_total", &[])),
        );
        p.extra.insert(
            "controller_reconcile_errors".into(),
            json!(metric_sum(
                &metrics,
                "podgroup_sync_reconcile_total",
                &[("result", "error")]
            )),
        );
        log!("podgroup-sync, burst: peak RSS {} MiB", stats.hwm_mib);
        let wrong = verify_pod_groups(client, &created, check, true).await?;
        self.conclude(p, ok, wrong);

        Ok((ctl, created))
    }

    /// (b) restart with nothing changed: SIGTERM, start again; no PodGroup may be written.
    async fn pgs_restart(&mut self, ctx: &PhaseCtx<'_>, mut ctl: Proc) -> Res<Proc> {
        let n = self.cli.jobs;
        let PhaseCtx {
            cp, client, watch, ..
        } = *ctx;
        let pre = ctl.stats();
        let shutdown = tokio::task::block_in_place(|| ctl.terminate(Duration::from_secs(30)));
        log!(
            "podgroup-sync stopped (SIGTERM → exit {:.2} s); restarting",
            shutdown.as_secs_f64()
        );
        let before = Requests::scrape(client).await?;
        let t0 = Instant::now();
        let mut ctl = spawn_controller(
            &self.cli,
            &self.controller_bin,
            cp,
            self.out.join("podgroup-sync-2.log"),
        )?;
        let ready = wait_ready(&mut ctl, Duration::from_secs(120)).await?;
        let reconciles = |c: &Proc| -> f64 {
            c.get("/metrics")
                .map(|(_, b)| metric_sum(&b, "podgroup_sync_reconcile_total", &[]))
                .unwrap_or(0.0)
        };
        let mut reconciled_at = None;
        let mut last = (0.0, Instant::now());
        let deadline = Instant::now() + self.converge_timeout();
        while Instant::now() < deadline {
            let r = tokio::task::block_in_place(|| reconciles(&ctl));
            if reconciled_at.is_none() && r >= n as f64 {
                reconciled_at = Some(t0.elapsed());
            }
            if r != last.0 {
                last = (r, Instant::now());
            } else if reconciled_at.is_some() && last.1.elapsed() > Duration::from_secs(3) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let settled = last.1.saturating_duration_since(t0);
        let after = Requests::scrape(client).await?;
        let stats = ctl.stats();
        let metrics = tokio::task::block_in_place(|| ctl.get("/metrics"))
            .map(|(_, b)| b)
            .unwrap_or_default();
        let mut p = Phase::new("podgroup-sync-restart", n);
        let d = after.since(&before);
        p.requests(&d, 0.0);
        p.window_len_s = t0.elapsed().as_secs_f64();
        p.process = Some(stats);
        p.cpu_s = Some(stats.cpu_s);
        p.converged = reconciled_at.is_some();
        p.correct = watch.present_with_prefix("pgs-");
        p.extra.insert("shutdown_s".into(), json!(secs(shutdown)));
        p.extra.insert("ready_s".into(), json!(secs(ready)));
        p.extra
            .insert("all_reconciled_s".into(), json!(reconciled_at.map(secs)));
        p.extra
            .insert("reconciles_settled_s".into(), json!(secs(settled)));
        p.extra
            .insert("controller_reconciles".into(), json!(last.0));
        let controller_writes = controller_counts(&mut p, &metrics);
        p.extra.insert(
            "event_writes".into(),
            json!(d.sum(|v, r, _| r.starts_with("events") && WRITE_VERBS.contains(&v))),
        );
        p.extra
            .insert("first_instance_before_sigterm".into(), json!(pre));
        if reconciled_at.is_none() {
            self.fail(format!(
                "podgroup-sync restart: reconcile_total {} < {n} within {:?}",
                last.0,
                self.converge_timeout()
            ));
        }
        if p.podgroup_writes != 0.0 || controller_writes != 0.0 {
            self.fail(format!(
                "podgroup-sync restart: {} PodGroup writes at the API server ({controller_writes} by the controller's count); must be 0",
                p.podgroup_writes
            ));
        }
        log!(
            "podgroup-sync, restart: ready {:.2} s, all reconciled {:?}, PodGroup writes {}",
            ready.as_secs_f64(),
            reconciled_at,
            p.podgroup_writes
        );
        self.phases.push(p);

        Ok(ctl)
    }

    /// (c) backlog: stopped, every PodGroup deleted, started again.
    async fn pgs_backlog(
        &mut self,
        ctx: &PhaseCtx<'_>,
        created: &[Created],
        mut ctl: Proc,
    ) -> Res<Proc> {
        let (n, m) = (self.cli.jobs, self.cli.namespaces);
        let PhaseCtx {
            cp,
            client,
            watch,
            check,
        } = *ctx;
        tokio::task::block_in_place(|| ctl.terminate(Duration::from_secs(30)));
        delete_pod_groups(client, watch, "pgs", m).await?;
        log!("podgroup-sync, backlog: {n} jobs without PodGroups; starting the controller");
        let mut w = Window::open("podgroup-sync-backlog", n, client, watch, "pgs-", check).await?;
        let mut ctl = spawn_controller(
            &self.cli,
            &self.controller_bin,
            cp,
            self.out.join("podgroup-sync-3.log"),
        )?;
        w.t0 = ctl.spawned;
        let ready = wait_ready(&mut ctl, Duration::from_secs(120)).await?;
        let ok = watch.wait_correct(n, self.converge_timeout()).await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let mut p = w.close(client, created, watch, true, 0.0).await?;
        let stats = ctl.stats();
        p.process = Some(stats);
        p.cpu_s = Some(stats.cpu_s);
        p.extra.insert("ready_s".into(), json!(secs(ready)));
        if let Some(c) = p.converge_s {
            p.extra.insert(
                "converge_after_ready_s".into(),
                json!(round(c - ready.as_secs_f64(), 3)),
            );
        }
        let wrong = verify_pod_groups(client, created, check, true).await?;
        self.conclude(p, ok, wrong);
        Ok(ctl)
    }
}

impl Bench {
    /// (d) steady state: jobs at a constant rate into the cluster holding N jobs.
    async fn pgs_steady(&mut self, ctx: &PhaseCtx<'_>, ctl: &Proc) -> Res<()> {
        let (rate, secs_) = (self.cli.steady_rate, self.cli.steady_seconds);
        let count = (rate * secs_ as f64).round() as usize;
        let PhaseCtx { client, watch, .. } = *ctx;
        log!("podgroup-sync, steady state: {count} jobs at {rate}/s");
        let w = Window::open(
            "podgroup-sync-steady",
            count,
            client,
            watch,
            "pgs-",
            ctx.check,
        )
        .await?;
        let cpu0 = ctl.stats().cpu_s;
        let posts = AtomicU64::new(0);
        let created = create_jobs_at_rate(
            client,
            "pgs",
            count,
            self.cli.namespaces,
            rate,
            None,
            &posts,
        )
        .await?;
        let ok = watch.wait_correct(count, self.converge_timeout()).await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let posts = posts.load(Ordering::Relaxed) as f64;
        let mut p = w.close(client, &created, watch, false, posts).await?;
        let stats = ctl.stats();
        p.process = Some(stats);
        p.cpu_s = Some(round(stats.cpu_s - cpu0, 2));
        let wrong = verify_pod_groups(client, &created, ctx.check, true).await?;
        self.conclude(p, ok, wrong);
        Ok(())
    }
}

/// Records the controller's own count of its PodGroup writes and Events in the phase; returns
/// the writes.
fn controller_counts(p: &mut Phase, metrics: &str) -> f64 {
    let writes = metric_sum(metrics, "podgroup_sync_podgroup_writes_total", &[]);
    p.extra
        .insert("controller_podgroup_writes".into(), json!(writes));
    p.extra.insert(
        "controller_events".into(),
        json!(metric_sum(metrics, "podgroup_sync_events_total", &[])),
    );
    writes
}

/// What the phases of one contender share: its control plane, client, PodGroup watch and check.
#[derive(Clone, Copy)]
pub(crate) struct PhaseCtx<'a> {
    pub(crate) cp: &'a ControlPlane,
    pub(crate) client: &'a kube::Client,
    pub(crate) watch: &'a PgWatch,
    pub(crate) check: &'a Check,
}

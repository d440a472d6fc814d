//! Contender 1: the bare client, the limit on the same client stack.

use std::sync::atomic::{AtomicU64, Ordering};

use futures::{StreamExt, TryStreamExt};

#[allow(unused_imports)]
use crate::*;

impl Bench {
    /// Phase 1: the bare client.
    pub(crate) async fn bare(&mut self) -> Res<()> {
        let (n, m, c) = (
            self.cli.jobs,
            self.cli.namespaces,
            self.cli.concurrency as usize,
        );
        let mut cp = ControlPlane::start(self.out.join("cp-bare"))?;
        let client = cp.client().await?;
        create_namespaces(&client, "bare", m, &[]).await?;
        let watch = PgWatch::start(&client).await?;
        let check = Check::exact()?;

        // (a) burst: jobs created at once, each PodGroup applied on the job's create response.
        log!(
            "bare client, burst: {n} jobs ({} creates in flight), each PodGroup applied at once ({c} in flight)",
            self.cli.creators
        );
        let w = Window::open("bare-burst", n, &client, &watch, "bare-", &check).await?;
        let apiserver0 = cp.cpu_of("kube-apiserver");
        let posts = AtomicU64::new(0);
        let (tx, writer) = pod_group_writer(&client, c);
        let created =
            create_jobs(&client, "bare", n, m, self.cli.creators, Some(tx), &posts).await?;
        writer.await.map_err(|e| err(e.to_string()))??;
        let ok = watch.wait_correct(n, self.converge_timeout()).await;
        let posts = posts.load(Ordering::Relaxed) as f64;
        let mut p = w.close(&client, &created, &watch, false, posts).await?;
        if let (Some(a0), Some(a1)) = (apiserver0, cp.cpu_of("kube-apiserver")) {
            p.extra.insert(
                "apiserver_cpu_s".into(),
                serde_json::json!(round(a1 - a0, 2)),
            );
        }
        self.conclude(p, ok, Vec::new());

        // (b) backlog: the same N PodGroups written again from the known jobs.
        delete_pod_groups(&client, &watch, "bare", m).await?;
        log!("bare client, backlog: {n} PodGroups applied, {c} in flight");
        let w = Window::open("bare-backlog", n, &client, &watch, "bare-", &check).await?;
        futures::stream::iter(created.iter())
            .map(|job| apply_pod_group(&client, job))
            .buffer_unordered(c.max(1))
            .try_collect::<Vec<()>>()
            .await?;
        let ok = watch.wait_correct(n, self.converge_timeout()).await;
        let p = w.close(&client, &created, &watch, true, 0.0).await?;
        let wrong = verify_pod_groups(&client, &created, &check, true).await?;
        self.conclude(p, ok, wrong);
        if self.cli.steady_seconds > 0 {
            self.bare_steady(&client, &watch, &check).await?;
        }
        drop(watch);
        cp.stop();
        Ok(())
    }

    /// (c) steady state: jobs at a constant rate into the cluster holding N jobs, each PodGroup
    /// applied right after its job's create response.
    async fn bare_steady(
        &mut self,
        client: &kube::Client,
        watch: &PgWatch,
        check: &Check,
    ) -> Res<()> {
        let (rate, secs_) = (self.cli.steady_rate, self.cli.steady_seconds);
        let count = (rate * secs_ as f64).round() as usize;
        log!("bare client, steady state: {count} jobs at {rate}/s");
        let w = Window::open("bare-steady", count, client, watch, "bare-", check).await?;
        let posts = AtomicU64::new(0);
        let (tx, writer) = pod_group_writer(client, self.cli.concurrency as usize);
        let created = create_jobs_at_rate(
            client,
            "bare",
            count,
            self.cli.namespaces,
            rate,
            Some(tx),
            &posts,
        )
        .await?;
        writer.await.map_err(|e| err(e.to_string()))??;
        let ok = watch.wait_correct(count, self.converge_timeout()).await;
        let posts = posts.load(Ordering::Relaxed) as f64;
        let p = w.close(client, &created, watch, false, posts).await?;
        let wrong = verify_pod_groups(client, &created, check, true).await?;
        self.conclude(p, ok, wrong);
        Ok(())
    }
}

type Writer = tokio::task::JoinHandle<Res<Vec<()>>>;

/// Applies the PodGroup of every job sent to it, `in_flight` at once, as soon as it arrives.
fn pod_group_writer(
    client: &kube::Client,
    in_flight: usize,
) -> (tokio::sync::mpsc::UnboundedSender<Created>, Writer) {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Created>();
    let client = client.clone();
    let writer = tokio::spawn(async move {
        futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|c| (c, rx)) })
            .map(|job| {
                let client = client.clone();
                async move { apply_pod_group(&client, &job).await }
            })
            .buffer_unordered(in_flight.max(1))
            .try_collect::<Vec<()>>()
            .await
    });
    (tx, writer)
}

//! The floor (issue 29): the least a controller on the same client stack does for the same
//! result, run in podgroup-sync's place (`--floor`) to measure what that much costs in CPU.
//!
//! It is kube-runtime's `Controller` as its documentation shapes one: PyTorchJobs watched whole
//! as `DynamicObject`s, their PodGroups watched as owned objects, and per reconcile the job read
//! through podgroup-sync's own pure pipeline (`job::normalize`, `gang::compute`,
//! `backend::desired_object`) and its PodGroup server-side applied unless the cached one already
//! says so. Nothing else: no packed caches, no queue of its own, no Events, no leader election,
//! no webhook, no health, and a `/metrics` of two counters (the ones the benchmark reads). What
//! podgroup-sync spends beyond this is the price of everything it does beyond this.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use futures::StreamExt;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::runtime::controller::{Action, Config as ControllerConfig, Controller};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Client, ResourceExt};
use podgroup_sync::backend::{self, BackendOptions, SchedulerPlugins};
use podgroup_sync::gang::{self, Priorities};
use podgroup_sync::job::{self, PYTORCHJOB};
use podgroup_sync::resources::AdmissionDefaults;

#[allow(unused_imports)]
use crate::*;

/// The first argument that makes the benchmark's binary the floor controller.
pub(crate) const SUBCOMMAND: &str = "floor-controller";

/// What the benchmark reads at `/metrics` and `/readyz`.
#[derive(Default)]
struct Counters {
    reconciles: AtomicU64,
    writes: AtomicU64,
    ready: AtomicBool,
}

/// `floor-controller --kubeconfig PATH --http-addr ADDR [--concurrency=N] ...` (the arguments
/// the benchmark gives podgroup-sync; others are ignored).
pub(crate) fn floor_main(args: &[String]) -> std::process::ExitCode {
    let value = |name: &str| -> Option<String> {
        let eq = format!("{name}=");
        args.iter().enumerate().find_map(|(i, a)| {
            a.strip_prefix(&eq)
                .map(str::to_string)
                .or_else(|| (a == name).then(|| args.get(i + 1).cloned()).flatten())
        })
    };
    let (Some(kubeconfig), Some(addr)) = (value("--kubeconfig"), value("--http-addr")) else {
        eprintln!("floor-controller: --kubeconfig and --http-addr are required");
        return std::process::ExitCode::FAILURE;
    };
    let concurrency = value("--concurrency")
        .and_then(|c| c.parse().ok())
        .unwrap_or(16u16);
    let counters = Arc::new(Counters::default());
    let result = addr
        .parse::<SocketAddr>()
        .map_err(|e| err(e.to_string()))
        .and_then(|a| serve(a, counters.clone()))
        .and_then(|()| {
            tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .map_err(|e| err(e.to_string()))
        })
        .and_then(|rt| rt.block_on(run(&kubeconfig, concurrency, counters)));
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("floor-controller: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// `/readyz` and `/metrics` on a thread of their own, one connection at a time.
fn serve(addr: SocketAddr, counters: Arc<Counters>) -> Res<()> {
    let listener = TcpListener::bind(addr)?;
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut s) = stream else { continue };
            let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
            // The whole head (a client may write it in pieces), at most 4 KiB.
            let (mut buf, mut chunk) = (Vec::new(), [0u8; 512]);
            while !buf.windows(4).any(|w| w == b"\r\n\r\n") && buf.len() < 4096 {
                match s.read(&mut chunk) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            }
            let request = String::from_utf8_lossy(&buf);
            let (code, body) = if request.starts_with("GET /metrics") {
                let c = &counters;
                (
                    200,
                    format!(
                        "podgroup_sync_reconcile_total {}\npodgroup_sync_podgroup_writes_total {}\n",
                        c.reconciles.load(Ordering::Relaxed),
                        c.writes.load(Ordering::Relaxed)
                    ),
                )
            } else if request.starts_with("GET /readyz") && counters.ready.load(Ordering::Relaxed) {
                (200, "ok".to_string())
            } else {
                (503, "not ready".to_string())
            };
            let _ = write!(
                s,
                "HTTP/1.1 {code} X\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    Ok(())
}

struct Ctx {
    client: Client,
    pod_groups: reflector::Store<DynamicObject>,
    counters: Arc<Counters>,
}

async fn run(kubeconfig: &str, concurrency: u16, counters: Arc<Counters>) -> Res<()> {
    if let Ok(f) = std::env::var("FLOOR_LOG") {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(f))
            .init();
    }
    let kc = kube::config::Kubeconfig::read_from(kubeconfig)?;
    let config =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await?;
    let client = Client::try_from(config)?;
    let jobs: Api<DynamicObject> = Api::all_with(client.clone(), &pytorchjob_ar());
    let pgs: Api<DynamicObject> = Api::all_with(client.clone(), &podgroup_ar());
    let pg_writer = reflector::store::Writer::<DynamicObject>::new(podgroup_ar());
    let pod_groups = pg_writer.as_reader();
    let pg_events = watcher(pgs, watcher::Config::default())
        .reflect(pg_writer)
        .touched_objects();
    let controller = Controller::new_with(jobs, watcher::Config::default(), pytorchjob_ar())
        .owns_stream_with(pg_events, podgroup_ar())
        .with_config(ControllerConfig::default().concurrency(concurrency));
    let (job_store, pg_store) = (controller.store(), pod_groups.clone());
    let ctx = Arc::new(Ctx {
        client,
        pod_groups,
        counters: counters.clone(),
    });
    // Polled again and again: kube-runtime's readiness wakes one waiter only (a oneshot
    // channel's receiver shared by every clone of the store), and the controller's own runner
    // waits on the job store too.
    tokio::spawn(async move {
        for store in [job_store, pg_store] {
            let tick = Duration::from_millis(50);
            while tokio::time::timeout(tick, store.wait_until_ready())
                .await
                .is_err()
            {}
        }
        counters.ready.store(true, Ordering::Relaxed);
    });
    controller
        .run(
            reconcile,
            |_, _, _| Action::requeue(Duration::from_secs(1)),
            ctx,
        )
        .for_each(|r| {
            if let Err(e) = r {
                eprintln!("floor-controller: {e}");
            }
            futures::future::ready(())
        })
        .await;
    Ok(())
}

/// The job's PodGroup, applied unless the cached one has every field it sets.
async fn reconcile(job: Arc<DynamicObject>, ctx: Arc<Ctx>) -> Result<Action, kube::Error> {
    ctx.counters.reconciles.fetch_add(1, Ordering::Relaxed);
    let ns = job.namespace().unwrap_or_default();
    let value = serde_json::to_value(&*job).map_err(kube::Error::SerdeError)?;
    let Ok(normal) = job::normalize(&PYTORCHJOB, &value) else {
        return Ok(Action::await_change());
    };
    let Ok(gang) = gang::compute(
        &normal,
        &Priorities::default(),
        &AdmissionDefaults::default(),
    ) else {
        return Ok(Action::await_change());
    };
    let Ok((name, _)) = backend::pod_group_name(&SchedulerPlugins, &normal) else {
        return Ok(Action::await_change());
    };
    let body = backend::desired_object(
        &SchedulerPlugins,
        &normal,
        &gang,
        &name,
        None,
        false,
        &BackendOptions::default(),
    );
    let key = reflector::ObjectRef::new_with(&name, podgroup_ar()).within(&ns);
    let same = ctx.pod_groups.get(&key).is_some_and(|pg| {
        let (have, want) = (pg.data.get("spec"), body.get("spec"));
        match (
            have.and_then(|h| h.as_object()),
            want.and_then(|w| w.as_object()),
        ) {
            (Some(h), Some(w)) => w.iter().all(|(k, v)| h.get(k) == Some(v)),
            _ => false,
        }
    });
    if !same {
        let api: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), &ns, &podgroup_ar());
        let params = PatchParams::apply("podgroup-sync").force();
        api.patch(&name, &params, &Patch::Apply(&body)).await?;
        ctx.counters.writes.fetch_add(1, Ordering::Relaxed);
    }
    Ok(Action::await_change())
}

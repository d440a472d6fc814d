//! `podgroup-sync run`: the controller process — API client, metrics and health ports, leader
//! election, the webhook, and shutdown on SIGTERM.

use super::{RunArgs, WebhookArgs, init_logging, lease_config, settings};
use crate::client as api;
use crate::controller::{self, RuntimeSettings, Signals};
use crate::events::Events;
use crate::http::{self, Health};
use crate::leader::{self, LeaseConfig};
use crate::liveness::InFlight;
use crate::liveness::Readiness;
use crate::metrics::Metrics;
use crate::reconcile::Settings;
use crate::webhook;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicI64;
use std::time::Duration;
use tokio::sync::watch;
use tracing::{error, info};

pub fn run_controller(args: RunArgs) -> std::process::ExitCode {
    init_logging(args.log_format);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    match runtime.block_on(controller_main(args)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            error!(error = %e, "podgroup-sync stopped");
            std::process::ExitCode::FAILURE
        }
    }
}

/// How long a connection to the API server may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

pub(crate) async fn client(
    kubeconfig: Option<&PathBuf>,
    deadlines: api::Deadlines,
) -> Result<kube::Client, Box<dyn std::error::Error>> {
    let mut config = match kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)?;
            kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?
        }
        None => kube::Config::infer().await?,
    };
    // An API server that does not accept a connection within this is down: fail fast and let
    // the watch and requeue backoffs retry, instead of hanging a reconcile.
    config.connect_timeout = Some(CONNECT_TIMEOUT);
    // No retries inside the client: its default retries a 429/503/504 up to 15 times with
    // delays growing to minutes, which holds a reconcile (and the Lease renewal) far past the
    // fault. Failed requests surface at once and are retried by the requeue and watch
    // backoffs, whose caps are seconds.
    config.default_retry = false;
    // kube sets no read timeout: the deadlines layer gives every request but watches one, and
    // fences writes behind the leader's Lease.
    Ok(kube::client::ClientBuilder::try_from(config)?
        .with_layer(&deadlines)
        .build())
}

/// Mirrors leadership into the `podgroup_sync_leader` gauge.
fn spawn_leader_gauge(mut leading: watch::Receiver<bool>, metrics: Arc<Metrics>) {
    tokio::spawn(async move {
        loop {
            metrics.leader.set(*leading.borrow_and_update() as i64);
            if leading.changed().await.is_err() {
                break;
            }
        }
    });
}

/// The settings checked before anything starts: the Lease (if leader election is on) and the
/// write fence that goes with it.
fn checked_lease(
    args: &RunArgs,
) -> Result<(Option<LeaseConfig>, Arc<api::Fence>), Box<dyn std::error::Error>> {
    let instance = &args.backend.instance;
    if !crate::backend::valid_label_value(instance) {
        return Err(format!("--instance {instance:?} is not a valid label value").into());
    }
    let lease = args.leader.enabled.then(|| lease_config(&args.leader));
    if let Some(cfg) = &lease {
        cfg.check()?;
    }
    let fence = if lease.is_some() {
        api::Fence::closed()
    } else {
        api::Fence::open()
    };
    Ok((lease, fence))
}

async fn controller_main(args: RunArgs) -> Result<(), Box<dyn std::error::Error>> {
    let (lease, fence) = checked_lease(&args)?;
    let metrics = Arc::new(Metrics::new());
    let deadlines = api::Deadlines {
        timeout: Duration::from_secs(args.api_timeout_seconds.max(1)),
        fence: fence.clone(),
        throttle: api::Throttle::new(Some(&metrics.registry)),
    };
    let client = client(args.kubeconfig.as_ref(), deadlines).await?;
    let readiness = Readiness::default();
    let heartbeat = Arc::new(AtomicI64::new(0));
    let in_flight = Arc::new(InFlight::default());
    let health = Health {
        metrics: metrics.clone(),
        readiness: readiness.clone(),
        heartbeat: heartbeat.clone(),
        wedged_after: Duration::from_secs((args.discovery_interval_seconds * 4).max(120)),
        // Far longer than any API call (--api-timeout-seconds) can hold a reconcile.
        reconcile_stuck_after: Duration::from_secs(600.max(args.api_timeout_seconds * 4)),
        cache_stall_after: Duration::from_secs(args.cache_stall_seconds.max(1)),
        in_flight: in_flight.clone(),
    };
    let listener = tokio::net::TcpListener::bind(args.http_addr).await?;
    tokio::spawn(http::serve(listener, health));

    let settings = settings(&args);
    if let Some(t) = settings
        .kueue_pods_ready_timeout
        .filter(|t| settings.gang_wait_warning >= *t)
    {
        tracing::warn!(
            gang_wait_warning_seconds = settings.gang_wait_warning.as_secs(),
            kueue_pods_ready_timeout_seconds = t.as_secs(),
            "--gang-wait-warning-seconds is not below Kueue's waitForPodsReady timeout: Kueue evicts a waiting gang before GangWaiting says it waits"
        );
    }
    let (caches_tx, caches_rx) = watch::channel(None);
    let mut draining = None;
    if args.webhook.serve {
        let certs = Certs {
            client: client.clone(),
            fence: fence.clone(),
        };
        draining = Some(start_webhook(&args.webhook, &settings, caches_rx, &metrics, certs).await?);
    }
    let events = Events::new(
        client.clone(),
        std::env::var("POD_NAME").ok(),
        metrics.clone(),
    );
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let (leading_tx, leading_rx) = watch::channel(!args.leader.enabled);
    // Sent once the controllers stopped: only then is the Lease released.
    let (release_tx, release_rx) = watch::channel(false);
    let election = if let Some(cfg) = lease {
        info!(lease = %cfg.name, namespace = %cfg.namespace, identity = %cfg.identity, "leader election on");
        Some(tokio::spawn(leader::run(
            client.clone(),
            cfg,
            fence,
            leading_tx,
            release_rx,
        )))
    } else {
        None
    };
    spawn_leader_gauge(leading_rx.clone(), metrics.clone());
    tokio::spawn(async move {
        shutdown_signal().await;
        let _ = shutdown_tx.send(true);
    });
    info!(
        version = env!("CARGO_PKG_VERSION"),
        "podgroup-sync starting"
    );
    let run = controller::run(
        client,
        settings,
        RuntimeSettings {
            concurrency: args.concurrency,
            discovery_interval: Duration::from_secs(args.discovery_interval_seconds.max(1)),
        },
        events,
        metrics,
        Signals {
            readiness,
            leading: leading_rx,
            heartbeat,
            shutdown: shutdown_rx,
            in_flight,
            caches: caches_tx,
        },
    );
    until_stopped(run, election, release_tx).await?;
    if let Some(draining) = draining {
        drain_webhook(&draining, Duration::from_secs(args.webhook.drain_seconds)).await;
    }
    Ok(())
}

/// After the controllers stopped and the Lease was handed over, the webhook keeps answering
/// for `drain` while endpoints and proxies drop this replica; each answer closes its
/// connection, so the API server's next call opens a connection to another replica.
async fn drain_webhook(draining: &std::sync::atomic::AtomicBool, drain: Duration) {
    info!(
        seconds = drain.as_secs(),
        "controllers stopped; the webhook answers while it drains, closing each connection after its answer"
    );
    draining.store(true, std::sync::atomic::Ordering::Relaxed);
    tokio::time::sleep(drain).await;
}

/// Runs the controllers until they stop, then hands the Lease over; an election task that ends
/// first (it ends only on shutdown, after the controllers) stops the process at once — its
/// fence stays closed, so nothing writes.
async fn until_stopped(
    run: impl std::future::Future<Output = Result<(), controller::RunError>>,
    election: Option<tokio::task::JoinHandle<()>>,
    release_tx: watch::Sender<bool>,
) -> Result<(), Box<dyn std::error::Error>> {
    let Some(mut election) = election else {
        drop(release_tx);
        return Ok(run.await?);
    };
    tokio::select! {
        r = run => {
            r?;
            // The controllers stopped after their in-flight reconciles: hand over now.
            let _ = release_tx.send(true);
            election.await?;
            Ok(())
        }
        r = &mut election => {
            r?;
            Err("leader election ended".into())
        }
    }
}

/// What a self-managed certificate needs from the controller.
struct Certs {
    client: kube::Client,
    fence: Arc<api::Fence>,
}

/// Binds the webhook's port, starts reading its certificate (files or the managed Secret) and
/// serves it.
async fn start_webhook(
    args: &WebhookArgs,
    settings: &Settings,
    caches: watch::Receiver<Option<crate::caches::Caches>>,
    metrics: &Metrics,
    certs: Certs,
) -> Result<Arc<std::sync::atomic::AtomicBool>, Box<dyn std::error::Error>> {
    let listener = tokio::net::TcpListener::bind(args.addr).await?;
    let draining = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let tls = Arc::new(webhook::tls::Reloading::default());
    let tls_metrics = webhook::tls::TlsMetrics::new(&metrics.registry);
    match &args.cert_secret {
        Some(secret) => {
            let (namespace, name) = secret.split_once('/').ok_or_else(|| {
                format!("--webhook-cert-secret {secret}: expected NAMESPACE/NAME")
            })?;
            let managed = webhook::managed::Managed {
                namespace: namespace.to_string(),
                secret: name.to_string(),
                configuration: args.webhook_configuration.clone().unwrap_or_default(),
                hosts: args.cert_hosts.clone(),
                validity: Duration::from_secs(args.cert_validity_seconds.max(30)),
            };
            tokio::spawn(webhook::managed::run(
                certs.client,
                managed,
                tls.clone(),
                certs.fence,
                tls_metrics,
            ));
        }
        None => {
            let files = webhook::tls::CertFiles {
                cert: args.cert_file.clone(),
                key: args.key_file.clone(),
            };
            tokio::spawn(tls.clone().watch(files, tls_metrics));
        }
    }
    let admission = Arc::new(webhook::Admission {
        caches,
        settings: settings.clone(),
        owner_wait: Duration::from_millis(args.owner_wait_ms),
        pod_group_wait: Duration::from_millis(args.pod_group_wait_ms),
        metrics: webhook::admit::AdmissionMetrics::new(&metrics.registry),
        draining: draining.clone(),
        memo: Default::default(),
    });
    tokio::spawn(webhook::serve(listener, tls, admission));
    Ok(draining)
}

/// Resolves on SIGTERM or Ctrl-C.
async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("SIGTERM handler");
        tokio::select! {
            _ = ctrl_c => {},
            _ = term.recv() => {},
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
    info!("shutdown signal received");
}

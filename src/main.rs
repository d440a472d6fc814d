//! The `podgroup-sync` binary: the controller (`run`, the default) and `explain`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicI64;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use tokio::sync::watch;
use tracing::{error, info};

use podgroup_sync::backend::{BackendKind, BackendOptions};
use podgroup_sync::client as api;
use podgroup_sync::controller::{self, Readiness, RuntimeSettings, Signals};
use podgroup_sync::enablement::{Enablement, Mode};
use podgroup_sync::events::Events;
use podgroup_sync::explain::{Surroundings, cluster, compare, explain_job, surroundings};
use podgroup_sync::http::{self, Health};
use podgroup_sync::leader::{self, LeaseConfig};
use podgroup_sync::liveness::InFlight;
use podgroup_sync::metrics::Metrics;
use podgroup_sync::reconcile::{ResizePolicy, Settings};
use podgroup_sync::webhook;

/// Gang-scheduling PodGroups for Kubeflow training jobs (PyTorchJob, TFJob, MPIJob, XGBoostJob,
/// PaddleJob, JAXJob), owned by a standalone controller, for scheduler-plugins coscheduling and
/// Volcano.
#[derive(Parser, Debug)]
#[command(name = "podgroup-sync", version, about, long_about = None, args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the controller against the cluster of the current kubeconfig or service account (the default).
    Run(Box<RunArgs>),
    /// Print the PodGroup a job would get, and why: offline from manifests, with a cluster's
    /// context (--kubeconfig), or for a job in the cluster compared with its PodGroup (--job).
    Explain(ExplainArgs),
}

#[derive(Args, Debug, Clone)]
struct BackendArgs {
    /// schedulerNames that run the coscheduling plugin (the pod-link check warns about others).
    #[arg(
        long,
        env = "PODGROUP_SYNC_COSCHEDULING_SCHEDULER_NAMES",
        value_delimiter = ',',
        default_value = "default-scheduler,scheduler-plugins-scheduler"
    )]
    coscheduling_scheduler_names: Vec<String>,
    /// The schedulerName of the Volcano scheduler.
    #[arg(
        long,
        env = "PODGROUP_SYNC_VOLCANO_SCHEDULER_NAME",
        default_value = "volcano"
    )]
    volcano_scheduler_name: String,
    /// scheduler-plugins scheduleTimeoutSeconds for jobs whose schedulingPolicy sets none
    /// (unset: omitted, so the plugin's permitWaitingTimeSeconds applies).
    #[arg(long, env = "PODGROUP_SYNC_DEFAULT_SCHEDULE_TIMEOUT_SECONDS")]
    default_schedule_timeout_seconds: Option<i32>,
    /// The schedulerName the pod-link webhook gives coscheduling pods that ask for the default
    /// scheduler (the scheduler-plugins chart's second scheduler); empty when coscheduling runs
    /// in the default scheduler. Volcano pods get --volcano-scheduler-name.
    #[arg(
        long,
        env = "PODGROUP_SYNC_LINK_COSCHEDULING_SCHEDULER_NAME",
        default_value = "scheduler-plugins-scheduler"
    )]
    link_coscheduling_scheduler_name: String,
    /// The name of this installation, when a cluster runs more than one (each with its own
    /// --annotation-key): its PodGroups carry the label podgroup-sync.io/instance=<name>, and
    /// another installation's PodGroups are never modified or deleted. Empty: the default
    /// installation, whose PodGroups carry no instance label (as every PodGroup written before
    /// this flag existed), so an upgrade writes nothing.
    #[arg(long, env = "PODGROUP_SYNC_INSTANCE", default_value = "")]
    instance: String,
}

impl BackendArgs {
    fn options(&self) -> BackendOptions {
        BackendOptions {
            coscheduling_scheduler_names: self.coscheduling_scheduler_names.clone(),
            volcano_scheduler_name: self.volcano_scheduler_name.clone(),
            default_schedule_timeout_seconds: self.default_schedule_timeout_seconds,
            link_coscheduling_scheduler_name: Some(self.link_coscheduling_scheduler_name.clone())
                .filter(|s| !s.is_empty()),
            instance: self.instance.clone(),
        }
    }
}

#[derive(Args, Debug, Clone)]
struct RunArgs {
    /// Namespace (and job) annotation that switches management on: "true" manages, "dry-run"
    /// only reports, anything else is off; "false" on a job opts that job out.
    #[arg(
        long,
        env = "PODGROUP_SYNC_ANNOTATION_KEY",
        default_value = "podgroup-sync.io/enabled"
    )]
    annotation_key: String,
    /// Mode of namespaces without the annotation: off, dry-run or true (manage everywhere).
    #[arg(
        long,
        env = "PODGROUP_SYNC_DEFAULT_MODE",
        value_enum,
        default_value = "off"
    )]
    default_mode: Mode,
    /// Backend when neither the job, its namespace nor its pod templates choose one.
    #[arg(
        long,
        env = "PODGROUP_SYNC_DEFAULT_BACKEND",
        value_enum,
        default_value = "scheduler-plugins"
    )]
    default_backend: BackendKind,
    /// When an existing PodGroup is resized: always (follows replica and policy changes, needed
    /// for HPA and elastic jobs), while-suspended, never.
    #[arg(
        long,
        env = "PODGROUP_SYNC_RESIZE",
        value_enum,
        default_value = "always"
    )]
    resize: ResizePolicy,
    /// Keep the PodGroups of finished (Succeeded/Failed) jobs instead of deleting them.
    #[arg(long, env = "PODGROUP_SYNC_KEEP_FINISHED")]
    keep_finished: bool,
    /// Seconds a scheduler-plugins PodGroup may stay Pending/Scheduling before a GangWaiting Event.
    #[arg(
        long,
        env = "PODGROUP_SYNC_GANG_WAIT_WARNING_SECONDS",
        default_value_t = 120
    )]
    gang_wait_warning_seconds: u64,
    #[command(flatten)]
    health: HealthArgs,
    #[command(flatten)]
    backend: BackendArgs,
    /// Jobs reconciled at once.
    #[arg(long, env = "PODGROUP_SYNC_CONCURRENCY", default_value_t = 16)]
    concurrency: u16,
    /// Seconds between checks for job and PodGroup CRDs that appeared or disappeared.
    #[arg(
        long,
        env = "PODGROUP_SYNC_DISCOVERY_INTERVAL_SECONDS",
        default_value_t = 30
    )]
    discovery_interval_seconds: u64,
    /// Seconds a cache may go without refreshing (its watch failing, or a relist not
    /// completing) before /healthz fails, so that a restart is tried. Readiness drops at once.
    #[arg(long, env = "PODGROUP_SYNC_CACHE_STALL_SECONDS", default_value_t = 300)]
    cache_stall_seconds: u64,
    /// Seconds any API request (watches aside) may take, answer included; a request that gets
    /// no complete answer in time fails and is retried by the backoffs. A leader's writes end
    /// sooner: at its renew deadline.
    #[arg(long, env = "PODGROUP_SYNC_API_TIMEOUT_SECONDS", default_value_t = 30)]
    api_timeout_seconds: u64,
    /// Address of /metrics, /healthz and /readyz.
    #[arg(long, env = "PODGROUP_SYNC_HTTP_ADDR", default_value = "0.0.0.0:8080")]
    http_addr: SocketAddr,
    /// Log format.
    #[arg(
        long,
        env = "PODGROUP_SYNC_LOG_FORMAT",
        value_enum,
        default_value = "text"
    )]
    log_format: LogFormat,
    #[command(flatten)]
    leader: LeaderArgs,
    #[command(flatten)]
    webhook: WebhookArgs,
    /// Kubeconfig file (default: $KUBECONFIG, ~/.kube/config, then the in-cluster service account).
    #[arg(long, env = "PODGROUP_SYNC_KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
}

#[derive(Args, Debug, Clone)]
struct HealthArgs {
    /// Seconds a gang that ran whole (minMember pods running) may have fewer pods running before
    /// a GangBroken Event on the job (scheduler-plugins and Volcano; the native PodGroup status
    /// counts no pods).
    #[arg(long, env = "PODGROUP_SYNC_GANG_BROKEN_SECONDS", default_value_t = 300)]
    gang_broken_seconds: u64,
    /// Seconds between audits of every PodGroup for stale ones (a job gone or finished): ours
    /// are deleted, others reported with a StalePodGroup Event. 0 turns the audit off.
    #[arg(
        long,
        env = "PODGROUP_SYNC_AUDIT_INTERVAL_SECONDS",
        default_value_t = 300
    )]
    audit_interval_seconds: u64,
    /// Report gangs that can never be placed: a pod that fits no schedulable node, minResources
    /// above all schedulable nodes together (GangInfeasible), a Volcano queue that does not exist
    /// or is not Open (QueueUnavailable). Watches Nodes and Queues (needs list/watch on them);
    /// never blocks a PodGroup.
    #[arg(long, env = "PODGROUP_SYNC_GANG_FEASIBILITY")]
    gang_feasibility: bool,
}

#[derive(Args, Debug, Clone)]
struct LeaderArgs {
    /// Elect a leader on a coordination.k8s.io Lease; only the leader writes (run several
    /// replicas with this on).
    #[arg(long = "leader-elect", env = "PODGROUP_SYNC_LEADER_ELECT")]
    enabled: bool,
    /// Namespace of the Lease (default: $POD_NAMESPACE, else "default").
    #[arg(long = "leader-elect-namespace", env = "POD_NAMESPACE")]
    namespace: Option<String>,
    /// Name of the Lease.
    #[arg(
        long = "leader-elect-lease-name",
        env = "PODGROUP_SYNC_LEADER_ELECT_LEASE_NAME",
        default_value = "podgroup-sync"
    )]
    lease_name: String,
    /// Seconds a leader's claim lasts without renewal; a standby takes over after it.
    #[arg(
        long = "leader-elect-lease-duration-seconds",
        env = "PODGROUP_SYNC_LEADER_ELECT_LEASE_DURATION_SECONDS",
        default_value_t = 15
    )]
    lease_duration_seconds: u64,
    /// Seconds a leader keeps trying to renew before it gives up and exits.
    #[arg(
        long = "leader-elect-renew-deadline-seconds",
        env = "PODGROUP_SYNC_LEADER_ELECT_RENEW_DEADLINE_SECONDS",
        default_value_t = 10
    )]
    renew_deadline_seconds: u64,
    /// Seconds between attempts to acquire or renew the Lease.
    #[arg(
        long = "leader-elect-retry-period-seconds",
        env = "PODGROUP_SYNC_LEADER_ELECT_RETRY_PERIOD_SECONDS",
        default_value_t = 2
    )]
    retry_period_seconds: u64,
    /// Identity written into the Lease (default: $POD_NAME, else hostname and process id).
    #[arg(long = "leader-elect-identity", env = "POD_NAME")]
    identity: Option<String>,
}

#[derive(Args, Debug, Clone)]
struct WebhookArgs {
    /// Serve the pod-link admission webhook (zero-touch: pods of managed jobs get their PodGroup
    /// link and scheduler at creation, so job templates need none). Every replica serves it.
    #[arg(long = "webhook", env = "PODGROUP_SYNC_WEBHOOK")]
    serve: bool,
    /// HTTPS address of the webhook (path /pod-link).
    #[arg(
        long = "webhook-addr",
        env = "PODGROUP_SYNC_WEBHOOK_ADDR",
        default_value = "0.0.0.0:9443"
    )]
    addr: SocketAddr,
    /// The webhook's serving certificate (PEM chain); re-read when it changes.
    #[arg(
        long = "webhook-cert-file",
        env = "PODGROUP_SYNC_WEBHOOK_CERT_FILE",
        default_value = "/etc/podgroup-sync/webhook/tls.crt"
    )]
    cert_file: PathBuf,
    /// The webhook's private key (PEM); re-read when it changes.
    #[arg(
        long = "webhook-key-file",
        env = "PODGROUP_SYNC_WEBHOOK_KEY_FILE",
        default_value = "/etc/podgroup-sync/webhook/tls.key"
    )]
    key_file: PathBuf,
    /// Milliseconds an admission waits for a job that its operator saw before our cache did
    /// (then the pod is admitted unlinked, logged and counted as owner_not_cached). Keep it
    /// below the webhook configuration's timeoutSeconds.
    #[arg(
        long = "webhook-owner-wait-ms",
        env = "PODGROUP_SYNC_WEBHOOK_OWNER_WAIT_MS",
        default_value_t = 2000
    )]
    owner_wait_ms: u64,
    /// Manage the serving certificate in this Secret (NAMESPACE/NAME, which must exist; it may
    /// be empty) instead of reading --webhook-cert-file: the controller makes a CA of its own
    /// and a serving certificate for --webhook-cert-hosts, renews each at two thirds of its
    /// life, and writes the CA into the caBundle of --webhook-configuration. Every replica
    /// serves what the Secret holds; only the leader writes. Needs neither cert-manager nor a
    /// chart that looks objects up.
    #[arg(long = "webhook-cert-secret", env = "PODGROUP_SYNC_WEBHOOK_CERT_SECRET", value_name = "NAMESPACE/NAME", requires_all = ["webhook_configuration", "cert_hosts"])]
    cert_secret: Option<String>,
    /// The MutatingWebhookConfiguration whose caBundle --webhook-cert-secret keeps current.
    #[arg(
        long = "webhook-configuration",
        env = "PODGROUP_SYNC_WEBHOOK_CONFIGURATION"
    )]
    webhook_configuration: Option<String>,
    /// The DNS names and IP addresses the managed serving certificate is for (comma-separated;
    /// the webhook Service's names).
    #[arg(
        long = "webhook-cert-hosts",
        env = "PODGROUP_SYNC_WEBHOOK_CERT_HOSTS",
        value_delimiter = ','
    )]
    cert_hosts: Vec<String>,
    /// Seconds a managed serving certificate is valid (renewed at two thirds; the CA lives ten
    /// times as long).
    #[arg(
        long = "webhook-cert-validity-seconds",
        env = "PODGROUP_SYNC_WEBHOOK_CERT_VALIDITY_SECONDS",
        default_value_t = 31_536_000
    )]
    cert_validity_seconds: u64,
}

#[derive(Args, Debug)]
struct ExplainArgs {
    /// Manifests (YAML or JSON, several documents each; "-" reads standard input): one job, and
    /// optionally the PriorityClasses, LimitRanges, RuntimeClasses, Nodes and Namespace around
    /// it. Repeatable.
    #[arg(short = 'f', long = "filename", required_unless_present = "job")]
    files: Vec<PathBuf>,
    /// Read the PriorityClasses, LimitRanges, RuntimeClasses, the Namespace and (if allowed) the
    /// Nodes from this cluster instead of assuming none.
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// Explain a job in the cluster (NAMESPACE/NAME, any managed kind) and compare the PodGroup
    /// podgroup-sync would apply with the one the cluster holds (uses --kubeconfig, else
    /// $KUBECONFIG or ~/.kube/config).
    #[arg(long, value_name = "NAMESPACE/NAME", conflicts_with = "files")]
    job: Option<String>,
    /// The enablement annotation key the controller runs with (for --job).
    #[arg(long, default_value = "podgroup-sync.io/enabled")]
    annotation_key: String,
    /// Backend to explain for (default: chosen as the controller would, without a cluster).
    #[arg(long, value_enum)]
    backend: Option<BackendKind>,
    #[command(flatten)]
    backend_args: BackendArgs,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("PODGROUP_SYNC_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Some(Command::Explain(args)) => run_explain(args),
        Some(Command::Run(args)) => run_controller(*args),
        None => run_controller(cli.run),
    }
}

fn read_manifests(files: &[PathBuf]) -> Result<Vec<String>, String> {
    files
        .iter()
        .map(|f| {
            if f.as_os_str() == "-" {
                std::io::read_to_string(std::io::stdin())
            } else {
                std::fs::read_to_string(f)
            }
            .map_err(|e| format!("{}: {e}", f.display()))
        })
        .collect()
}

fn run_explain(args: ExplainArgs) -> std::process::ExitCode {
    let result = if args.kubeconfig.is_some() || args.job.is_some() {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("tokio runtime")
            .block_on(explain_with_cluster(&args))
    } else {
        read_manifests(&args.files).and_then(|texts| {
            let (job, around) = surroundings::read(&texts).map_err(|e| e.to_string())?;
            explain_job(
                &job,
                &around,
                args.backend,
                None,
                &args.backend_args.options(),
            )
            .map(|e| e.text)
            .map_err(|e| e.to_string())
        })
    };
    match result {
        Ok(out) => {
            print!("{out}");
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("podgroup-sync explain: {e}");
            std::process::ExitCode::from(1)
        }
    }
}

/// `explain --kubeconfig` / `--job`: the cluster's context, and for `--job` the comparison.
async fn explain_with_cluster(args: &ExplainArgs) -> Result<String, String> {
    let deadlines = api::Deadlines {
        timeout: Duration::from_secs(30),
        fence: api::Fence::open(),
        throttle: api::Throttle::new(None),
    };
    let client = client(args.kubeconfig.as_ref(), deadlines)
        .await
        .map_err(|e| format!("cannot reach the cluster: {e}"))?;
    let opts = args.backend_args.options();
    let (job, given) = match &args.job {
        Some(nn) => {
            let (ns, name) = nn
                .split_once('/')
                .ok_or_else(|| format!("--job {nn}: expected NAMESPACE/NAME"))?;
            let job = cluster::find_job(&client, ns, name)
                .await
                .map_err(|e| e.to_string())?;
            (job, Surroundings::default())
        }
        None => {
            let texts = read_manifests(&args.files)?;
            surroundings::read(&texts).map_err(|e| e.to_string())?
        }
    };
    let namespace = job
        .pointer("/metadata/namespace")
        .and_then(|v| v.as_str())
        .unwrap_or("default")
        .to_string();
    let mut around = cluster::surroundings(&client, &namespace)
        .await
        .map_err(|e| e.to_string())?;
    around.add_given(given);
    let explained =
        explain_job(&job, &around, args.backend, None, &opts).map_err(|e| e.to_string())?;
    if args.job.is_none() {
        return Ok(explained.text);
    }
    let name = explained.object["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let actual = cluster::pod_group(&client, explained.backend, &namespace, &name)
        .await
        .map_err(|e| e.to_string())?;
    // Against an existing PodGroup, its immutable fields (and Volcano queue) stay as they are.
    let explained = match actual.as_ref().and_then(|a| a.get("spec")) {
        Some(spec) => explain_job(&job, &around, Some(explained.backend), Some(spec), &opts)
            .map_err(|e| e.to_string())?,
        None => explained,
    };
    let comparison = compare::compare(
        &explained,
        actual.as_ref(),
        around.namespace_annotations(&namespace),
        &args.annotation_key,
    );
    Ok(format!("{}{comparison}", explained.text))
}

fn run_controller(args: RunArgs) -> std::process::ExitCode {
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

async fn client(
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

/// Behaviour settings from the flags.
fn settings(args: &RunArgs) -> Settings {
    Settings {
        enablement: Enablement {
            annotation_key: args.annotation_key.clone(),
            default_mode: args.default_mode,
            default_backend: args.default_backend,
        },
        backend_options: args.backend.options(),
        resize: args.resize,
        keep_finished: args.keep_finished,
        gang_wait_warning: Duration::from_secs(args.gang_wait_warning_seconds),
        webhook: args.webhook.serve,
        gang_broken_after: Duration::from_secs(args.health.gang_broken_seconds),
        feasibility: args.health.gang_feasibility,
        audit_interval: Duration::from_secs(args.health.audit_interval_seconds),
    }
}

/// The Lease settings from the flags; the identity defaults to `<hostname>-<pid>`.
fn lease_config(leader: &LeaderArgs) -> LeaseConfig {
    let identity = leader.identity.clone().unwrap_or_else(|| {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        format!("{}-{}", host.trim(), std::process::id())
    });
    LeaseConfig {
        namespace: leader.namespace.clone().unwrap_or_else(|| "default".into()),
        name: leader.lease_name.clone(),
        identity,
        lease_duration: Duration::from_secs(leader.lease_duration_seconds),
        renew_deadline: Duration::from_secs(leader.renew_deadline_seconds),
        retry_period: Duration::from_secs(leader.retry_period_seconds.max(1)),
    }
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
    if !podgroup_sync::backend::valid_label_value(instance) {
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
    let (caches_tx, caches_rx) = watch::channel(None);
    if args.webhook.serve {
        let certs = Certs {
            client: client.clone(),
            fence: fence.clone(),
        };
        start_webhook(&args.webhook, &settings, caches_rx, &metrics, certs).await?;
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
    until_stopped(run, election, release_tx).await
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
    caches: watch::Receiver<Option<podgroup_sync::caches::Caches>>,
    metrics: &Metrics,
    certs: Certs,
) -> Result<(), Box<dyn std::error::Error>> {
    let listener = tokio::net::TcpListener::bind(args.addr).await?;
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
        metrics: webhook::admit::AdmissionMetrics::new(&metrics.registry),
    });
    tokio::spawn(webhook::serve(listener, tls, admission));
    Ok(())
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

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_well_formed() {
        super::Cli::command().debug_assert();
    }
}

//! The command line: every flag of `podgroup-sync run` (the default) and `podgroup-sync explain`,
//! with its help, and the settings the flags make. [`run`] starts the controller from them,
//! [`explain`] answers `explain`.

pub mod check;
pub mod explain;
pub mod run;
pub mod status;

use crate::backend::{BackendKind, BackendOptions};
use crate::enablement::{Enablement, Mode};
use crate::leader::LeaseConfig;
use crate::reconcile::{ResizePolicy, Settings};
use clap::{Args, Parser, Subcommand, ValueEnum};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// The file name kubectl's plugin convention wants for `kubectl podgroup-sync` (a link to this
/// binary; `make install` and the image put it beside it).
pub const PLUGIN_NAME: &str = "kubectl-podgroup_sync";

/// Gang-scheduling PodGroups for training and serving workloads (the Kubeflow training jobs,
/// JobSet, Trainer v2, LeaderWorkerSet, Ray), owned by a standalone controller, for
/// scheduler-plugins coscheduling, Volcano and Kubernetes' own gang scheduling.
#[derive(Parser, Debug)]
#[command(name = "podgroup-sync", version, about, long_about = None, args_conflicts_with_subcommands = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub run: RunArgs,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run the controller against the cluster of the current kubeconfig or service account (the default).
    Run(Box<RunArgs>),
    /// Print the PodGroup a job would get, and why: offline from manifests, with a cluster's
    /// context (--kubeconfig), or for a job in the cluster compared with its PodGroup (--job).
    Explain(ExplainArgs),
    /// A job's gang, its PodGroup, its pods, the last Events and what blocks it (the first thing
    /// to type when a job is Pending).
    Status(StatusArgs),
    /// Check an installation from inside the cluster (the chart's `helm test`): the controller
    /// is Ready, its webhook answers with a certificate its configuration's caBundle verifies,
    /// and its ServiceAccount holds every permission its flags need.
    Check(CheckArgs),
}

#[derive(Args, Debug, Clone)]
pub struct BackendArgs {
    /// schedulerNames that run the coscheduling plugin (the pod-link check warns about others).
    #[arg(
        long,
        env = "PODGROUP_SYNC_COSCHEDULING_SCHEDULER_NAMES",
        value_delimiter = ',',
        default_value = "default-scheduler,scheduler-plugins-scheduler"
    )]
    pub coscheduling_scheduler_names: Vec<String>,
    /// The schedulerName of the Volcano scheduler.
    #[arg(
        long,
        env = "PODGROUP_SYNC_VOLCANO_SCHEDULER_NAME",
        default_value = "volcano"
    )]
    pub volcano_scheduler_name: String,
    /// scheduler-plugins scheduleTimeoutSeconds for jobs whose schedulingPolicy sets none
    /// (unset: omitted, so the plugin's permitWaitingTimeSeconds applies).
    #[arg(long, env = "PODGROUP_SYNC_DEFAULT_SCHEDULE_TIMEOUT_SECONDS")]
    pub default_schedule_timeout_seconds: Option<i32>,
    /// The schedulerName the pod-link webhook gives coscheduling pods that ask for the default
    /// scheduler (the scheduler-plugins chart's second scheduler); empty when coscheduling runs
    /// in the default scheduler. Volcano pods get --volcano-scheduler-name.
    #[arg(
        long,
        env = "PODGROUP_SYNC_LINK_COSCHEDULING_SCHEDULER_NAME",
        default_value = "scheduler-plugins-scheduler"
    )]
    pub link_coscheduling_scheduler_name: String,
    /// The name of this installation, when a cluster runs more than one (each with its own
    /// --annotation-key): its PodGroups carry the label podgroup-sync.io/instance=<name>, and
    /// another installation's PodGroups are never modified or deleted. Empty: the default
    /// installation, whose PodGroups carry no instance label (as every PodGroup written before
    /// this flag existed), so an upgrade writes nothing.
    #[arg(long, env = "PODGROUP_SYNC_INSTANCE", default_value = "")]
    pub instance: String,
}

impl BackendArgs {
    pub fn options(&self) -> BackendOptions {
        BackendOptions {
            coscheduling_scheduler_names: self.coscheduling_scheduler_names.clone(),
            volcano_scheduler_name: self.volcano_scheduler_name.clone(),
            default_schedule_timeout_seconds: self.default_schedule_timeout_seconds,
            link_coscheduling_scheduler_name: Some(self.link_coscheduling_scheduler_name.clone())
                .filter(|s| !s.is_empty()),
            instance: self.instance.clone(),
            pods_labelled: false,
        }
    }
}

#[derive(Args, Debug, Clone)]
pub struct RunArgs {
    /// Namespace (and job) annotation that switches management on: "true" manages, "dry-run"
    /// only reports, anything else is off; "false" on a job opts that job out.
    #[arg(
        long,
        env = "PODGROUP_SYNC_ANNOTATION_KEY",
        default_value = "podgroup-sync.io/enabled"
    )]
    pub annotation_key: String,
    /// Mode of namespaces without the annotation: off, dry-run or true (manage everywhere).
    #[arg(
        long,
        env = "PODGROUP_SYNC_DEFAULT_MODE",
        value_enum,
        default_value = "off"
    )]
    pub default_mode: Mode,
    /// Backend when neither the job, its namespace nor its pod templates choose one.
    #[arg(
        long,
        env = "PODGROUP_SYNC_DEFAULT_BACKEND",
        value_enum,
        default_value = "scheduler-plugins"
    )]
    pub default_backend: BackendKind,
    /// When an existing PodGroup is resized: always (follows replica and policy changes, needed
    /// for HPA and elastic jobs), while-suspended, never.
    #[arg(
        long,
        env = "PODGROUP_SYNC_RESIZE",
        value_enum,
        default_value = "always"
    )]
    pub resize: ResizePolicy,
    /// Keep the PodGroups of finished (Succeeded/Failed) jobs instead of deleting them.
    #[arg(long, env = "PODGROUP_SYNC_KEEP_FINISHED")]
    pub keep_finished: bool,
    /// Watch batch/v1 Jobs: an Indexed Job annotated podgroup-sync.io/gang="true" gets a gang.
    /// Off by default: every Job of the cluster is then cached (those without the annotation as
    /// their metadata alone) and, with the webhook, their pods are watched for missing links.
    #[arg(long, env = "PODGROUP_SYNC_BATCH_JOBS")]
    pub batch_jobs: bool,
    /// Seconds a scheduler-plugins PodGroup may stay Pending/Scheduling before a GangWaiting Event.
    #[arg(
        long,
        env = "PODGROUP_SYNC_GANG_WAIT_WARNING_SECONDS",
        default_value_t = 120
    )]
    pub gang_wait_warning_seconds: u64,
    /// Kueue's waitForPodsReady timeout in seconds, when the cluster's Kueue sets one (its
    /// Configuration is not read): a job in a Kueue queue whose scheduleTimeoutSeconds is above
    /// it gets a GangTimeoutAboveKueue Event, and a --gang-wait-warning-seconds at or above it is
    /// logged at start (the gang would be evicted before GangWaiting says it waits).
    #[arg(long, env = "PODGROUP_SYNC_KUEUE_PODS_READY_TIMEOUT_SECONDS")]
    pub kueue_pods_ready_timeout_seconds: Option<u64>,
    #[command(flatten)]
    pub health: HealthArgs,
    #[command(flatten)]
    pub backend: BackendArgs,
    /// Jobs reconciled at once.
    #[arg(long, env = "PODGROUP_SYNC_CONCURRENCY", default_value_t = 16)]
    pub concurrency: u16,
    /// Seconds between checks for job and PodGroup CRDs that appeared or disappeared.
    #[arg(
        long,
        env = "PODGROUP_SYNC_DISCOVERY_INTERVAL_SECONDS",
        default_value_t = 30
    )]
    pub discovery_interval_seconds: u64,
    /// Seconds a cache may go without refreshing (its watch failing, or a relist not
    /// completing) before /healthz fails, so that a restart is tried. Readiness drops at once.
    #[arg(long, env = "PODGROUP_SYNC_CACHE_STALL_SECONDS", default_value_t = 300)]
    pub cache_stall_seconds: u64,
    /// Seconds any API request (watches aside) may take, answer included; a request that gets
    /// no complete answer in time fails and is retried by the backoffs. A leader's writes end
    /// sooner: at its renew deadline.
    #[arg(long, env = "PODGROUP_SYNC_API_TIMEOUT_SECONDS", default_value_t = 30)]
    pub api_timeout_seconds: u64,
    /// Address of /metrics, /healthz and /readyz.
    #[arg(long, env = "PODGROUP_SYNC_HTTP_ADDR", default_value = "0.0.0.0:8080")]
    pub http_addr: SocketAddr,
    /// Log format (text is coloured only on a terminal). The filter is the PODGROUP_SYNC_LOG variable (default `info`;
    /// `kube_runtime::controller=warn` is added unless it names kube_runtime).
    #[arg(
        long,
        env = "PODGROUP_SYNC_LOG_FORMAT",
        value_enum,
        default_value = "text"
    )]
    pub log_format: LogFormat,
    #[command(flatten)]
    pub leader: LeaderArgs,
    #[command(flatten)]
    pub webhook: WebhookArgs,
    /// Kubeconfig file (default: $KUBECONFIG, ~/.kube/config, then the in-cluster service account).
    #[arg(long, env = "PODGROUP_SYNC_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
}

#[derive(Args, Debug, Clone)]
pub struct HealthArgs {
    /// Seconds a gang that ran whole (minMember pods running) may have fewer pods running before
    /// a GangBroken Event on the job (scheduler-plugins and Volcano; the native PodGroup status
    /// counts no pods).
    #[arg(long, env = "PODGROUP_SYNC_GANG_BROKEN_SECONDS", default_value_t = 300)]
    pub gang_broken_seconds: u64,
    /// Seconds between audits of every PodGroup for stale ones (a job gone or finished): ours
    /// are deleted, others reported with a StalePodGroup Event. 0 turns the audit off.
    #[arg(
        long,
        env = "PODGROUP_SYNC_AUDIT_INTERVAL_SECONDS",
        default_value_t = 300
    )]
    pub audit_interval_seconds: u64,
    /// Report gangs that can never be placed: a pod that fits no schedulable node, minResources
    /// above all schedulable nodes together (GangInfeasible), a Volcano queue that does not exist
    /// or is not Open (QueueUnavailable). Watches Nodes and Queues (needs list/watch on them);
    /// never blocks a PodGroup.
    #[arg(long, env = "PODGROUP_SYNC_GANG_FEASIBILITY")]
    pub gang_feasibility: bool,
}

#[derive(Args, Debug, Clone)]
pub struct LeaderArgs {
    /// Elect a leader on a coordination.k8s.io Lease; only the leader writes (run several
    /// replicas with this on).
    #[arg(long = "leader-elect", env = "PODGROUP_SYNC_LEADER_ELECT")]
    pub enabled: bool,
    /// Namespace of the Lease (default: $POD_NAMESPACE, else "default").
    #[arg(long = "leader-elect-namespace", env = "POD_NAMESPACE")]
    pub namespace: Option<String>,
    /// Name of the Lease.
    #[arg(
        long = "leader-elect-lease-name",
        env = "PODGROUP_SYNC_LEADER_ELECT_LEASE_NAME",
        default_value = "podgroup-sync"
    )]
    pub lease_name: String,
    /// Seconds a leader's claim lasts without renewal; a standby takes over after it.
    #[arg(
        long = "leader-elect-lease-duration-seconds",
        env = "PODGROUP_SYNC_LEADER_ELECT_LEASE_DURATION_SECONDS",
        default_value_t = 15
    )]
    pub lease_duration_seconds: u64,
    /// Seconds a leader keeps trying to renew before it gives up and exits.
    #[arg(
        long = "leader-elect-renew-deadline-seconds",
        env = "PODGROUP_SYNC_LEADER_ELECT_RENEW_DEADLINE_SECONDS",
        default_value_t = 10
    )]
    pub renew_deadline_seconds: u64,
    /// Seconds between attempts to acquire or renew the Lease.
    #[arg(
        long = "leader-elect-retry-period-seconds",
        env = "PODGROUP_SYNC_LEADER_ELECT_RETRY_PERIOD_SECONDS",
        default_value_t = 2
    )]
    pub retry_period_seconds: u64,
    /// Identity written into the Lease (default: $POD_NAME, else hostname and process id).
    #[arg(long = "leader-elect-identity", env = "POD_NAME")]
    pub identity: Option<String>,
}

#[derive(Args, Debug, Clone)]
pub struct WebhookArgs {
    /// Serve the pod-link admission webhook (zero-touch: pods of managed jobs get their PodGroup
    /// link and scheduler at creation, so job templates need none). Every replica serves it.
    #[arg(long = "webhook", env = "PODGROUP_SYNC_WEBHOOK")]
    pub serve: bool,
    /// HTTPS address of the webhook (path /pod-link).
    #[arg(
        long = "webhook-addr",
        env = "PODGROUP_SYNC_WEBHOOK_ADDR",
        default_value = "0.0.0.0:9443"
    )]
    pub addr: SocketAddr,
    /// The webhook's serving certificate (PEM chain); re-read when it changes.
    #[arg(
        long = "webhook-cert-file",
        env = "PODGROUP_SYNC_WEBHOOK_CERT_FILE",
        default_value = "/etc/podgroup-sync/webhook/tls.crt"
    )]
    pub cert_file: PathBuf,
    /// The webhook's private key (PEM); re-read when it changes.
    #[arg(
        long = "webhook-key-file",
        env = "PODGROUP_SYNC_WEBHOOK_KEY_FILE",
        default_value = "/etc/podgroup-sync/webhook/tls.key"
    )]
    pub key_file: PathBuf,
    /// Milliseconds an admission waits for a job that its operator saw before our cache did
    /// (then the pod is admitted unlinked, logged and counted as owner_not_cached), and for a
    /// job the cache still shows suspended while its operator already makes pods (admitted by
    /// Kueue a moment ago; then the pod is skipped as suspended). Keep it below the webhook
    /// configuration's timeoutSeconds.
    #[arg(
        long = "webhook-owner-wait-ms",
        env = "PODGROUP_SYNC_WEBHOOK_OWNER_WAIT_MS",
        default_value_t = 2000
    )]
    pub owner_wait_ms: u64,
    /// Milliseconds a linked pod waits for its PodGroup to reach the cache (the controller
    /// creates it at the job's admission: a job Kueue has just unsuspended), so the PodGroup
    /// exists before the gang's first pod; then the pod is admitted linked all the same. 0: no
    /// wait. Keep it below the webhook configuration's timeoutSeconds.
    #[arg(
        long = "webhook-pod-group-wait-ms",
        env = "PODGROUP_SYNC_WEBHOOK_POD_GROUP_WAIT_MS",
        default_value_t = 1000
    )]
    pub pod_group_wait_ms: u64,
    /// Seconds the webhook keeps answering after SIGTERM, once the controllers have stopped and
    /// the Lease is handed over: while the Service's endpoints and the nodes' proxies drop this
    /// replica, calls still reach it; each answer then closes its connection, so the API server
    /// opens the next one to another replica. Keep it below the pod's termination grace period.
    #[arg(
        long = "webhook-drain-seconds",
        env = "PODGROUP_SYNC_WEBHOOK_DRAIN_SECONDS",
        default_value_t = 5
    )]
    pub drain_seconds: u64,
    /// Manage the serving certificate in this Secret (NAMESPACE/NAME, which must exist; it may
    /// be empty) instead of reading --webhook-cert-file: the controller makes a CA of its own
    /// and a serving certificate for --webhook-cert-hosts, renews each at two thirds of its
    /// life, and writes the CA into the caBundle of --webhook-configuration. Every replica
    /// serves what the Secret holds; only the leader writes. Needs neither cert-manager nor a
    /// chart that looks objects up.
    #[arg(long = "webhook-cert-secret", env = "PODGROUP_SYNC_WEBHOOK_CERT_SECRET", value_name = "NAMESPACE/NAME", requires_all = ["webhook_configuration", "cert_hosts"])]
    pub cert_secret: Option<String>,
    /// The MutatingWebhookConfiguration whose caBundle --webhook-cert-secret keeps current.
    #[arg(
        long = "webhook-configuration",
        env = "PODGROUP_SYNC_WEBHOOK_CONFIGURATION"
    )]
    pub webhook_configuration: Option<String>,
    /// The DNS names and IP addresses the managed serving certificate is for (comma-separated;
    /// the webhook Service's names).
    #[arg(
        long = "webhook-cert-hosts",
        env = "PODGROUP_SYNC_WEBHOOK_CERT_HOSTS",
        value_delimiter = ','
    )]
    pub cert_hosts: Vec<String>,
    /// Seconds a managed serving certificate is valid (renewed at two thirds; the CA lives ten
    /// times as long).
    #[arg(
        long = "webhook-cert-validity-seconds",
        env = "PODGROUP_SYNC_WEBHOOK_CERT_VALIDITY_SECONDS",
        default_value_t = 31_536_000
    )]
    pub cert_validity_seconds: u64,
}

#[derive(Args, Debug)]
pub struct ExplainArgs {
    /// Manifests (YAML or JSON, several documents each; "-" reads standard input): one job, and
    /// optionally the PriorityClasses, LimitRanges, RuntimeClasses, Nodes and Namespace around
    /// it. Repeatable.
    #[arg(short = 'f', long = "filename", required_unless_present_any = ["job", "target"])]
    pub files: Vec<PathBuf>,
    /// NAMESPACE/NAME: the same as --job (`kubectl podgroup-sync explain NAMESPACE/NAME`).
    #[arg(value_name = "NAMESPACE/NAME", conflicts_with_all = ["files", "job"])]
    pub target: Option<String>,
    /// Read the PriorityClasses, LimitRanges, RuntimeClasses, the Namespace and (if allowed) the
    /// Nodes from this cluster instead of assuming none.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Explain a job in the cluster (NAMESPACE/NAME, any managed kind) and compare the PodGroup
    /// podgroup-sync would apply with the one the cluster holds (uses --kubeconfig, else
    /// $KUBECONFIG or ~/.kube/config).
    #[arg(long, value_name = "NAMESPACE/NAME", conflicts_with = "files")]
    pub job: Option<String>,
    /// The enablement annotation key the controller runs with (for --job).
    #[arg(long, default_value = "podgroup-sync.io/enabled")]
    pub annotation_key: String,
    /// Backend to explain for (default: chosen as the controller would, without a cluster).
    #[arg(long, value_enum)]
    pub backend: Option<BackendKind>,
    #[command(flatten)]
    pub backend_args: BackendArgs,
}

#[derive(Args, Debug)]
pub struct StatusArgs {
    /// The job (any managed kind).
    #[arg(value_name = "NAMESPACE/NAME")]
    pub job: String,
    /// The cluster (default: $KUBECONFIG, else ~/.kube/config, else the service account).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// The enablement annotation key the controller runs with.
    #[arg(long, default_value = "podgroup-sync.io/enabled")]
    pub annotation_key: String,
    /// How many of the newest Events (on the job, its PodGroup and its pods) to show.
    #[arg(long, default_value_t = 10)]
    pub events: usize,
    /// Backend to look for (default: chosen as the controller would).
    #[arg(long, value_enum)]
    pub backend: Option<BackendKind>,
    #[command(flatten)]
    pub backend_args: BackendArgs,
}

#[derive(Args, Debug)]
pub struct CheckArgs {
    /// The namespace of the installation.
    #[arg(long, env = "POD_NAMESPACE")]
    pub namespace: String,
    /// The controller's Deployment (its flags say what to check).
    #[arg(long)]
    pub deployment: String,
    /// The Service in front of /metrics and /readyz, if the chart made one.
    #[arg(long)]
    pub metrics_service: Option<String>,
    /// The MutatingWebhookConfiguration of the pod-link webhook (default: the Deployment's name).
    #[arg(long)]
    pub webhook_configuration: Option<String>,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// Behaviour settings from the flags.
pub fn settings(args: &RunArgs) -> Settings {
    Settings {
        enablement: Enablement {
            annotation_key: args.annotation_key.clone(),
            default_mode: args.default_mode,
            default_backend: args.default_backend,
        },
        backend_options: BackendOptions {
            pods_labelled: args.webhook.serve,
            ..args.backend.options()
        },
        resize: args.resize,
        keep_finished: args.keep_finished,
        batch_jobs: args.batch_jobs,
        gang_wait_warning: Duration::from_secs(args.gang_wait_warning_seconds),
        webhook: args.webhook.serve,
        gang_broken_after: Duration::from_secs(args.health.gang_broken_seconds),
        feasibility: args.health.gang_feasibility,
        audit_interval: Duration::from_secs(args.health.audit_interval_seconds),
        kueue_pods_ready_timeout: args
            .kueue_pods_ready_timeout_seconds
            .map(Duration::from_secs),
    }
}

/// The Lease settings from the flags; the identity defaults to `<hostname>-<pid>`.
pub fn lease_config(leader: &LeaderArgs) -> LeaseConfig {
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

/// Logs to standard error, as text (coloured on a terminal only) or JSON, filtered by
/// `PODGROUP_SYNC_LOG` (default `info`).
pub fn init_logging(format: LogFormat) {
    let spec = std::env::var("PODGROUP_SYNC_LOG").unwrap_or_else(|_| "info".into());
    let filter = tracing_subscriber::EnvFilter::try_new(log_directives(&spec))
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(log_directives("info")));
    // Colour only on a terminal: escape codes in a log file or `kubectl logs` are noise, and
    // writing them is a share of each line's cost.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

/// The filter's directives: `spec`, plus `kube_runtime::controller=warn` unless `spec` names
/// kube_runtime itself. kube-runtime opens an info span per reconcile whose fields the log
/// formatter renders into text at once — a few percent of the controller's CPU in a burst, for
/// a prefix that repeats what podgroup-sync's own lines name (the job and its namespace).
fn log_directives(spec: &str) -> String {
    if spec.contains("kube_runtime") {
        spec.to_string()
    } else {
        format!("{spec},kube_runtime::controller=warn")
    }
}

#[cfg(test)]
mod tests {
    use super::Cli;

    #[test]
    fn kube_runtimes_reconcile_span_is_off_unless_asked_for() {
        assert_eq!(
            super::log_directives("info"),
            "info,kube_runtime::controller=warn"
        );
        assert_eq!(
            super::log_directives("debug,kube_runtime=debug"),
            "debug,kube_runtime=debug"
        );
    }
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_well_formed() {
        Cli::command().debug_assert();
    }
}

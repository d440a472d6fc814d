//! The workload model every step below the watches shares (SPEC §11): a watched object of any
//! kind, read by its kind's file into **pod sets** — name, pod count, minimum count, pod
//! template, in or out of the gang — plus the scheduling hints and the lifecycle state.
//! minMember, minResources, the backends, the planner, the webhook and health all work on this
//! model only; what a kind's fields mean is known only to that kind's file (`kinds`).
//!
//! Nothing here imports a step of the pipeline: the model sits below all of them.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde::Deserialize;
use serde_json::Value;

/// Why a workload cannot get a PodGroup. Each is reported as an `InvalidSpec` Warning Event and
/// counted by reason; none is retried until the object changes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidJob {
    #[error("the job has no spec.{0}")]
    NoReplicaSpecs(&'static str),
    #[error("unknown replica type {0:?} (expected one of {1})")]
    UnknownReplicaType(String, String),
    #[error("replica types {0:?} and {1:?} are the same type in different case")]
    DuplicateReplicaType(String, String),
    #[error("replica type {0}: no pod template")]
    MissingTemplate(String),
    #[error("replica type {0}: invalid pod template: {1}")]
    InvalidTemplate(String, String),
    #[error("replica type {0}: replicas must be a non-negative integer, got {1}")]
    InvalidReplicas(String, String),
    #[error("the job has zero replicas in total")]
    ZeroReplicas,
    #[error("the gang has {0} pods, more than a PodGroup can hold (2147483647)")]
    TooManyReplicas(u128),
    #[error("invalid spec: {0}")]
    Malformed(String),
    #[error("schedulingPolicy.minAvailable must be at least 1, got {0}")]
    MinAvailableTooSmall(i64),
    #[error(
        "schedulingPolicy.minAvailable {min_available} is above the {total} pods the job has: the gang could never be scheduled"
    )]
    MinAvailableAboveTotal { min_available: u64, total: u64 },
    #[error("elasticPolicy: {0}")]
    InvalidElasticPolicy(String),
    #[error("{0}")]
    InvalidResources(String),
    #[error("an MPIJob needs a Launcher replica spec; its operator starts no job without one")]
    MissingLauncher,
    #[error("replica type {0}: the pod template has no containers")]
    NoContainers(String),
    #[error("{0}")]
    InvalidPodGroupName(String),
    #[error("{0}")]
    InvalidSchedulingPolicy(String),
    /// The API server refused the PodGroup the job asks for (422/400): retried only once the
    /// job changes.
    #[error("the API server refused the PodGroup: {0}")]
    RefusedByApiServer(String),
    /// The object is not a gang: a kind that is one only on request (an Indexed batch/v1 Job
    /// with the gang annotation) without the request, or a shape that cannot be one.
    #[error("{0}")]
    NotAGang(String),
    /// A malformed topology request (SPEC §13).
    #[error("topology: {0}")]
    InvalidTopology(String),
}

impl InvalidJob {
    /// A short CamelCase label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            InvalidJob::NoReplicaSpecs(_) => "NoReplicaSpecs",
            InvalidJob::UnknownReplicaType(..) => "UnknownReplicaType",
            InvalidJob::DuplicateReplicaType(..) => "DuplicateReplicaType",
            InvalidJob::MissingTemplate(_) => "MissingTemplate",
            InvalidJob::InvalidTemplate(..) => "InvalidTemplate",
            InvalidJob::InvalidReplicas(..) => "InvalidReplicas",
            InvalidJob::ZeroReplicas => "ZeroReplicas",
            InvalidJob::TooManyReplicas(_) => "TooManyReplicas",
            InvalidJob::Malformed(_) => "Malformed",
            InvalidJob::MinAvailableTooSmall(_) => "MinAvailableTooSmall",
            InvalidJob::MinAvailableAboveTotal { .. } => "MinAvailableAboveTotal",
            InvalidJob::InvalidElasticPolicy(_) => "InvalidElasticPolicy",
            InvalidJob::InvalidResources(_) => "InvalidResources",
            InvalidJob::MissingLauncher => "MissingLauncher",
            InvalidJob::NoContainers(_) => "NoContainers",
            InvalidJob::InvalidPodGroupName(_) => "InvalidPodGroupName",
            InvalidJob::InvalidSchedulingPolicy(_) => "InvalidSchedulingPolicy",
            InvalidJob::RefusedByApiServer(_) => "RefusedByApiServer",
            InvalidJob::NotAGang(_) => "NotAGang",
            InvalidJob::InvalidTopology(_) => "InvalidTopology",
        }
    }
}

/// The scheduling hints of a gang: Kubeflow's `runPolicy.schedulingPolicy` for the kinds that
/// have one (identical in shape for v1 and v2beta1), empty for the others.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", default)]
pub struct SchedulingPolicy {
    pub min_available: Option<i64>,
    pub queue: Option<String>,
    pub min_resources: Option<BTreeMap<String, Quantity>>,
    pub priority_class: Option<String>,
    pub schedule_timeout_seconds: Option<i32>,
}

/// One set of identical pods of a workload: a Kubeflow replica type, a JobSet's replicated job,
/// a Ray worker group.
#[derive(Debug, Clone, PartialEq)]
pub struct PodSet {
    /// The set's name as the kind names it (`Master`, `Worker`, a replicated job's name, …).
    pub name: String,
    /// Pods the set has (after the operator's defaulting).
    pub count: u64,
    /// Of those, how many must run for the gang to make progress, when the kind says fewer than
    /// all (an elastic minimum), and the field that said so.
    pub minimum: Option<(u64, &'static str)>,
    /// Whether the set's pods belong to the gang (mpi-operator's launcher created only after
    /// the workers are ready does not).
    pub in_gang: bool,
    pub template: PodTemplateSpec,
    /// How many identical groups the set's pods come in, each indexed from 0 (a JobSet's
    /// replicated Jobs); 1 for a set indexed as a whole.
    pub groups: u64,
}

impl PodSet {
    /// A set whose every pod belongs to the gang.
    pub fn whole(name: impl Into<String>, count: u64, template: PodTemplateSpec) -> Self {
        PodSet {
            name: name.into(),
            count,
            minimum: None,
            in_gang: true,
            template,
            groups: 1,
        }
    }
}

/// Which rule set minMember (SPEC §3.1, §11).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MinMemberRule {
    /// §3.1.2 `schedulingPolicy.minAvailable`.
    MinAvailable,
    /// §3.1.3 Σ non-Worker replicas + `elasticPolicy.minReplicas`.
    ElasticMinReplicas,
    /// §3.1.4 MPIJob v2beta1: Worker replicas + 1 launcher.
    MpiWorkersPlusLauncher,
    /// §3.1.4 MPIJob v2beta1 with `WaitForWorkersReady`: the workers only.
    MpiWorkersOnly,
    /// §3.1.5 Σ replicas over all replica types.
    SumOfReplicas,
    /// §11 Σ pods over the pod sets of the gang, as the kind counts them.
    SumOfPodSets,
}

impl MinMemberRule {
    pub fn describe(&self) -> &'static str {
        match self {
            MinMemberRule::MinAvailable => "schedulingPolicy.minAvailable (SPEC 3.1.2)",
            MinMemberRule::ElasticMinReplicas => {
                "non-Worker replicas + elasticPolicy.minReplicas (SPEC 3.1.3)"
            }
            MinMemberRule::MpiWorkersPlusLauncher => "Worker replicas + 1 launcher (SPEC 3.1.4)",
            MinMemberRule::MpiWorkersOnly => {
                "Worker replicas; launcherCreationPolicy WaitForWorkersReady leaves the launcher out of the gang (SPEC 3.1.4)"
            }
            MinMemberRule::SumOfReplicas => "sum of replicas over all replica types (SPEC 3.1.5)",
            MinMemberRule::SumOfPodSets => "sum of pods over the pod sets of the gang (SPEC 11)",
        }
    }
}

/// The identity of an object, read even when its spec is invalid, so the failure can be
/// reported on it.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ObjectIdentity {
    pub name: String,
    pub namespace: Option<String>,
    pub uid: Option<String>,
    pub annotations: BTreeMap<String, String>,
    pub owner_references: Vec<Owner>,
}

impl ObjectIdentity {
    /// The owner reference with `controller: true`, if any.
    pub fn controller(&self) -> Option<&Owner> {
        self.owner_references
            .iter()
            .find(|o| o.controller == Some(true))
    }
}

/// An owner reference, the fields a kind reads.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Owner {
    pub api_version: String,
    pub kind: String,
    pub name: String,
    pub controller: Option<bool>,
}

/// What a kind's file reads from an object's `spec`: the model without the object's identity.
#[derive(Debug, Clone, PartialEq)]
pub struct Shape {
    /// Pod sets in the kind's canonical order.
    pub pod_sets: Vec<PodSet>,
    pub hints: SchedulingPolicy,
    pub suspended: bool,
    /// The controller the object names as its manager (`runPolicy.managedBy`, `spec.managedBy`).
    pub managed_by: Option<String>,
    /// The rule minMember follows when the hints name no minimum.
    pub rule: MinMemberRule,
    /// Doubts about the spec that matter only when that rule sets minMember.
    pub rule_warnings: Vec<String>,
    /// False for an object of a kind that is a gang only on request, without the request.
    pub gang_requested: bool,
}

/// A workload as its operator's defaulting would see it: everything the gang computation needs.
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    pub kind: &'static JobKind,
    pub name: String,
    pub namespace: String,
    pub uid: String,
    pub annotations: BTreeMap<String, String>,
    /// What the kind's file read from the spec: pod sets, hints, lifecycle, the minMember rule.
    pub shape: Shape,
    /// The kind's status says the workload has finished (succeeded or failed).
    pub finished: bool,
    /// `None`: one gang, the PodGroup named after the object. `Some(n)`: `n` gangs of the same
    /// pod sets, one per group of the object (a LeaderWorkerSet's), PodGroups `<name>-<i>` for
    /// `i` in `0..n`.
    pub groups: Option<u32>,
}

impl Job {
    pub fn suspended(&self) -> bool {
        self.shape.suspended
    }

    /// Whether another controller (e.g. MultiKueue) manages this job, so its operator — and we —
    /// leave it alone.
    pub fn managed_elsewhere(&self) -> bool {
        matches!(&self.shape.managed_by, Some(m) if !m.is_empty() && m != self.kind.default_manager)
    }

    /// The scheduling hints, where the backends read them.
    pub fn scheduling_policy(&self) -> Option<&SchedulingPolicy> {
        Some(&self.shape.hints)
    }

    /// Σ pods over all pod sets.
    pub fn total_pods(&self) -> u64 {
        self.shape.pod_sets.iter().map(|r| r.count).sum()
    }

    pub fn pod_set(&self, name: &str) -> Option<&PodSet> {
        self.shape.pod_sets.iter().find(|r| r.name == name)
    }

    /// Whether the pods of the named set belong to the gang (an unknown set does).
    pub fn in_gang(&self, name: &str) -> bool {
        self.pod_set(name).is_none_or(|s| s.in_gang)
    }
}

/// One kind and version podgroup-sync can watch.
pub struct JobKind {
    pub kind: &'static str,
    pub group: &'static str,
    pub version: &'static str,
    pub plural: &'static str,
    /// The `spec` field holding the Kubeflow replica specs; empty for other kinds.
    pub replica_specs_field: &'static str,
    /// Canonical Kubeflow replica-type names (keys are matched case-insensitively against
    /// these); empty for other kinds.
    pub replica_types: &'static [&'static str],
    /// The `managedBy` value of the operator that serves this kind.
    pub default_manager: &'static str,
    /// The label the operator puts on every pod it creates for an object of this kind, naming
    /// the object (the webhook's objectSelector term and the unlinked-pod watch's selector).
    pub pod_label: &'static str,
    /// How the kind is read into the model.
    pub rules: &'static dyn KindRules,
}

impl PartialEq for JobKind {
    fn eq(&self, other: &Self) -> bool {
        (self.group, self.version, self.kind) == (other.group, other.version, other.kind)
    }
}

impl Eq for JobKind {}

impl std::fmt::Debug for JobKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.api_version(), self.kind)
    }
}

impl JobKind {
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// The kind as a dynamic API resource.
    pub fn api_resource(&self) -> kube::discovery::ApiResource {
        kube::discovery::ApiResource {
            group: self.group.into(),
            version: self.version.into(),
            api_version: self.api_version(),
            kind: self.kind.into(),
            plural: self.plural.into(),
        }
    }

    /// The kind as the caches key it (one shared copy, see [`crate::packed::Kind`]).
    pub fn shared(&self) -> crate::packed::Kind {
        crate::packed::kind_of(self.group, self.version, self.kind, || self.api_resource())
    }

    /// The canonical name of a replica-type key, matched case-insensitively.
    pub fn canonical_type(&self, key: &str) -> Option<&'static str> {
        self.replica_types
            .iter()
            .copied()
            .find(|t| t.eq_ignore_ascii_case(key))
    }

    /// Whether this is one of the Kubeflow training kinds (`spec.runPolicy`, replica specs).
    pub fn is_kubeflow(&self) -> bool {
        !self.replica_specs_field.is_empty()
    }
}

/// How one kind's object is read into the model: its file's whole knowledge of the kind.
pub trait KindRules: Send + Sync {
    /// The object's `spec` (and metadata: a kind may be a gang only on request, or managed by
    /// its owner) → its pod sets, hints and lifecycle, defaulted as the operator would.
    fn read(
        &self,
        kind: &'static JobKind,
        spec: &Value,
        meta: &ObjectIdentity,
    ) -> Result<Shape, InvalidJob>;

    /// Whether the object's `status` says it has finished (it will start no more pods).
    fn finished(&self, status: Option<&Value>) -> bool {
        condition_true(status, &["Succeeded", "Failed"])
    }

    /// True when every pod must run for any to make progress (mpirun), so a minAvailable below
    /// the total is worth a warning.
    fn needs_every_pod(&self) -> bool {
        false
    }

    /// The pod templates inside the object's `spec`, for the cache to strip to what is read.
    fn templates_mut<'a>(
        &self,
        kind: &'static JobKind,
        spec: &'a mut Value,
    ) -> Vec<&'a mut serde_json::Map<String, Value>>;

    /// Whether an object with these annotations asks to be a gang (kinds that are gangs only on
    /// request); the cache keeps only the metadata of one that does not.
    fn requested(&self, _annotations: &BTreeMap<String, String>) -> bool {
        true
    }

    /// The `status` fields [`finished`](Self::finished) and [`groups`](Self::groups) read (the
    /// cache keeps only these).
    fn status_fields(&self) -> &'static [&'static str] {
        &["conditions"]
    }

    /// Whether the kind's pods carry their index within their pod set ([`pod_index`]).
    ///
    /// [`pod_index`]: Self::pod_index
    fn indexes_pods(&self) -> bool {
        false
    }

    /// A pod's index within its pod set `set`, from the labels its operator gave it: the slices
    /// of SPEC §13 are cut by it. `None` for a kind whose pods carry none, or a pod without it.
    fn pod_index(&self, _set: &PodSet, _labels: &BTreeMap<String, String>) -> Option<u64> {
        None
    }

    /// How many gangs the object has now, for a kind whose object is several gangs of the same
    /// pod sets (one per group); `None` for a kind whose object is one gang.
    fn groups(&self, _spec: &Value, _status: Option<&Value>) -> Result<Option<u32>, InvalidJob> {
        Ok(None)
    }
}

/// A label's value as an index.
pub fn index_label(labels: &BTreeMap<String, String>, key: &str) -> Option<u64> {
    labels.get(key)?.parse().ok()
}

/// The object at `path` (field names) below `value`, if it is an object.
pub fn object_at<'a>(
    value: &'a mut Value,
    path: &[&str],
) -> Option<&'a mut serde_json::Map<String, Value>> {
    let mut v = value;
    for p in path {
        v = v.get_mut(*p)?;
    }
    v.as_object_mut()
}

/// Whether `status.conditions` has one of `types` with status `"True"`.
pub fn condition_true(status: Option<&Value>, types: &[&str]) -> bool {
    let conditions = status
        .and_then(|s| s.get("conditions"))
        .and_then(Value::as_array);
    conditions.into_iter().flatten().any(|c| {
        c.get("type")
            .and_then(Value::as_str)
            .is_some_and(|t| types.contains(&t))
            && c.get("status").and_then(Value::as_str) == Some("True")
    })
}

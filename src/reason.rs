//! What podgroup-sync says on objects: every Event reason with its type. Below both the Events
//! that publish them and the metrics that count them.

/// An Event's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Normal,
    Warning,
}

impl EventType {
    pub fn as_str(&self) -> &'static str {
        match self {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        }
    }
}

/// Every reason podgroup-sync publishes an Event for, with its type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    /// No PodGroup can be made from the job's spec (or the API server refused it).
    InvalidSpec,
    /// The backend annotation names no known backend.
    InvalidBackend,
    /// The backend's PodGroup CRD is not served.
    BackendUnavailable,
    /// The PodGroup is made, but something in the spec is doubtful.
    GangSpecWarning,
    /// A replica template's pods will not join the PodGroup.
    MissingPodGroupLink,
    PodsNotLinked,
    /// A PodGroup of that name belongs to someone else.
    PodGroupConflict,
    /// An admission webhook or policy refused the PodGroup; sent again with a backoff.
    PodGroupRefused,
    /// The scheduler says the gang cannot be scheduled.
    GangUnschedulable,
    /// The gang has been waiting longer than the warning threshold.
    GangWaiting,
    /// A gang that ran whole has had fewer than minMember pods running past the threshold.
    GangBroken,
    /// A broken gang is whole again.
    GangRecovered,
    /// A pod of the gang fits no schedulable node, or minResources exceed them all together.
    GangInfeasible,
    /// A gang reported infeasible (or its queue unavailable) can be placed again.
    GangFeasible,
    /// The Volcano queue of the gang does not exist or is not Open.
    QueueUnavailable,
    /// On a PodGroup podgroup-sync did not make: its controller is gone or finished.
    StalePodGroup,
    /// The gang's pods request other resources than Kueue admitted (SPEC §12).
    KueueQuotaDiffers,
    /// scheduleTimeoutSeconds outlasts Kueue's waitForPodsReady timeout (SPEC §12).
    GangTimeoutAboveKueue,
    /// The backend does not enforce (part of) the job's topology request (SPEC §13).
    TopologyNotEnforced,
    /// Dry-run: the PodGroup that would be created.
    WouldCreatePodGroup,
    /// Dry-run: the PodGroup change that would be applied.
    WouldUpdatePodGroup,
    /// Dry-run: a stale PodGroup of ours that the audit would delete.
    WouldDeletePodGroup,
}

impl Reason {
    pub const ALL: [Reason; 22] = [
        Reason::InvalidSpec,
        Reason::InvalidBackend,
        Reason::BackendUnavailable,
        Reason::GangSpecWarning,
        Reason::MissingPodGroupLink,
        Reason::PodsNotLinked,
        Reason::PodGroupConflict,
        Reason::PodGroupRefused,
        Reason::GangUnschedulable,
        Reason::GangWaiting,
        Reason::GangBroken,
        Reason::GangRecovered,
        Reason::GangInfeasible,
        Reason::GangFeasible,
        Reason::QueueUnavailable,
        Reason::StalePodGroup,
        Reason::KueueQuotaDiffers,
        Reason::GangTimeoutAboveKueue,
        Reason::TopologyNotEnforced,
        Reason::WouldCreatePodGroup,
        Reason::WouldUpdatePodGroup,
        Reason::WouldDeletePodGroup,
    ];

    pub fn as_str(&self) -> &'static str {
        match self {
            Reason::InvalidSpec => "InvalidSpec",
            Reason::InvalidBackend => "InvalidBackend",
            Reason::BackendUnavailable => "BackendUnavailable",
            Reason::GangSpecWarning => "GangSpecWarning",
            Reason::MissingPodGroupLink => "MissingPodGroupLink",
            Reason::PodsNotLinked => "PodsNotLinked",
            Reason::PodGroupConflict => "PodGroupConflict",
            Reason::PodGroupRefused => "PodGroupRefused",
            Reason::GangUnschedulable => "GangUnschedulable",
            Reason::GangWaiting => "GangWaiting",
            Reason::GangBroken => "GangBroken",
            Reason::GangRecovered => "GangRecovered",
            Reason::GangInfeasible => "GangInfeasible",
            Reason::GangFeasible => "GangFeasible",
            Reason::QueueUnavailable => "QueueUnavailable",
            Reason::StalePodGroup => "StalePodGroup",
            Reason::KueueQuotaDiffers => "KueueQuotaDiffers",
            Reason::GangTimeoutAboveKueue => "GangTimeoutAboveKueue",
            Reason::TopologyNotEnforced => "TopologyNotEnforced",
            Reason::WouldCreatePodGroup => "WouldCreatePodGroup",
            Reason::WouldUpdatePodGroup => "WouldUpdatePodGroup",
            Reason::WouldDeletePodGroup => "WouldDeletePodGroup",
        }
    }

    pub fn type_(&self) -> EventType {
        match self {
            Reason::WouldCreatePodGroup
            | Reason::WouldUpdatePodGroup
            | Reason::WouldDeletePodGroup
            | Reason::GangRecovered
            | Reason::GangFeasible
            | Reason::TopologyNotEnforced => EventType::Normal,
            _ => EventType::Warning,
        }
    }
}

//! Gang health and hygiene (SPEC §10): what happens around a PodGroup once it exists.
//!
//! Pure decisions: [`broken`] (a gang that ran whole and lost pods), [`feasible`] (a gang no
//! schedulable node or queue can take), [`audit`] (PodGroups whose job is gone or finished).
//! I/O: [`capacity`] keeps the stripped Node and Volcano Queue caches, [`auditor`] runs the
//! periodic audit and carries out what it finds.

pub mod audit;
pub mod auditor;
pub mod broken;
pub mod capacity;
pub mod feasible;

use crate::backend::BackendKind;

/// What one process remembers of a job's gang health, per PodGroup of the job (one, or one per
/// group of a job of several gangs), by name.
pub type GangHealth = std::collections::BTreeMap<String, JobHealth>;

/// What one process remembers of the gang health of one PodGroup between reconciles.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct JobHealth {
    /// The backend of the PodGroup this is about.
    pub backend: Option<BackendKind>,
    /// Broken-gang memory of its PodGroup.
    pub gang: broken::GangMemory,
    /// `GangInfeasible` (capacity) was reported and not yet cleared.
    pub infeasible: bool,
    /// `QueueUnavailable` was reported and not yet cleared.
    pub queue_unavailable: bool,
}

impl JobHealth {
    /// Nothing worth remembering.
    pub fn is_blank(&self) -> bool {
        !self.gang.ran
            && self.gang.short_since.is_none()
            && !self.gang.broken
            && !self.infeasible
            && !self.queue_unavailable
    }
}

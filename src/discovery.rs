//! Which job kinds and PodGroup backends the API server serves, and what changed between two
//! looks: discovery runs at start-up and then periodically, so a CRD installed or removed later
//! is picked up without a restart (SPEC §1).

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use kube::Client;

use crate::backend::{BACKENDS, BackendKind};
use crate::job::{JobKind, KINDS};

/// Longest wait between discovery attempts after a failure (the first retry is after 1 s).
pub const DISCOVERY_RETRY_MAX: Duration = Duration::from_secs(4);

/// What the API server serves, as far as podgroup-sync cares.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Served {
    pub kinds: BTreeSet<(&'static str, &'static str)>,
    pub backends: BTreeSet<BackendKind>,
    /// Kueue's Workloads (`kueue.x-k8s.io/v1beta2`, SPEC §12).
    pub kueue: bool,
    /// Volcano's HyperNodes (`topology.volcano.sh/v1alpha1`, SPEC §13): their tier names.
    pub hyper_nodes: bool,
}

impl Served {
    pub fn has_kind(&self, kind: &JobKind) -> bool {
        self.kinds.contains(&(kind.kind, kind.version))
    }
}

/// Asks the API server which job kinds and PodGroup backends it serves.
pub async fn discover(client: &Client, kinds: &[&'static JobKind]) -> Result<Served, kube::Error> {
    let mut served = Served::default();
    let mut lists: HashMap<String, Option<Vec<String>>> = HashMap::new();
    let mut resources_of = async |gv: String| -> Result<Option<Vec<String>>, kube::Error> {
        if let Some(r) = lists.get(&gv) {
            return Ok(r.clone());
        }
        let r = match client.list_api_group_resources(&gv).await {
            Ok(list) => Some(list.resources.into_iter().map(|r| r.name).collect()),
            Err(kube::Error::Api(e)) if e.code == 404 => None,
            Err(e) => return Err(e),
        };
        lists.insert(gv, r.clone());
        Ok(r)
    };
    for kind in kinds {
        // Only one version of a kind (MPIJob) is watched: the first served in table order.
        if served.kinds.iter().any(|(k, _)| *k == kind.kind) {
            continue;
        }
        if resources_of(kind.api_version())
            .await?
            .is_some_and(|r| r.iter().any(|n| n == kind.plural))
        {
            served.kinds.insert((kind.kind, kind.version));
        }
    }
    for b in BACKENDS {
        let ar = b.backend().api_resource();
        if resources_of(ar.api_version.clone())
            .await?
            .is_some_and(|r| r.contains(&ar.plural))
        {
            served.backends.insert(b);
        }
    }
    let workloads = crate::kueue::workload_resource();
    served.kueue = resources_of(workloads.api_version)
        .await?
        .is_some_and(|r| r.contains(&workloads.plural));
    let hyper_nodes = crate::tiers::hyper_node_resource();
    served.hyper_nodes = resources_of(hyper_nodes.api_version)
        .await?
        .is_some_and(|r| r.contains(&hyper_nodes.plural));
    Ok(served)
}

/// The wait before discovery attempt `failures + 1`: 1 s doubling to [`DISCOVERY_RETRY_MAX`].
pub fn discovery_retry(failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(8);
    (Duration::from_secs(1) * 2u32.pow(doublings)).min(DISCOVERY_RETRY_MAX)
}

/// What to start and stop so that what runs matches what is served (pure).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Changes {
    pub start_backends: Vec<BackendKind>,
    pub stop_backends: Vec<BackendKind>,
    pub start_kinds: Vec<&'static JobKind>,
    pub stop_kinds: Vec<&'static JobKind>,
    /// Start (true) or stop (false) the Workload watch.
    pub kueue: Option<bool>,
    /// Start (true) or stop (false) the HyperNode watch.
    pub hyper_nodes: Option<bool>,
}

/// The difference between what runs and what is served. Backends and kinds keep the order of
/// their tables. Computed against what *runs* rather than the last discovery, so a cache that
/// could not start is tried again at the next discovery.
pub fn changes(running: &Served, served: &Served) -> Changes {
    let backends = |a: &Served, b: &Served| -> Vec<BackendKind> {
        BACKENDS
            .into_iter()
            .filter(|k| a.backends.contains(k) && !b.backends.contains(k))
            .collect()
    };
    let kinds = |a: &Served, b: &Served| -> Vec<&'static JobKind> {
        KINDS
            .iter()
            .copied()
            .filter(|k| a.has_kind(k) && !b.has_kind(k))
            .collect()
    };
    Changes {
        start_backends: backends(served, running),
        stop_backends: backends(running, served),
        start_kinds: kinds(served, running),
        stop_kinds: kinds(running, served),
        kueue: (running.kueue != served.kueue).then_some(served.kueue),
        hyper_nodes: (running.hyper_nodes != served.hyper_nodes).then_some(served.hyper_nodes),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::{MPIJOB_V1, MPIJOB_V2BETA1, PYTORCHJOB, TFJOB, XGBOOSTJOB};

    fn served(kinds: &[&JobKind], backends: &[BackendKind]) -> Served {
        Served {
            kinds: kinds.iter().map(|k| (k.kind, k.version)).collect(),
            backends: backends.iter().copied().collect(),
            kueue: false,
            hyper_nodes: false,
        }
    }

    #[test]
    fn nothing_changed_is_no_change() {
        let s = served(&[&PYTORCHJOB], &[BackendKind::Volcano]);
        assert_eq!(changes(&s, &s), Changes::default());
    }

    #[test]
    fn a_crd_that_appears_is_started_and_one_that_goes_is_stopped() {
        let before = served(&[&PYTORCHJOB, &TFJOB], &[BackendKind::SchedulerPlugins]);
        let after = served(&[&PYTORCHJOB, &XGBOOSTJOB], &[BackendKind::Volcano]);
        let c = changes(&before, &after);
        assert_eq!(c.start_kinds, vec![&XGBOOSTJOB]);
        assert_eq!(c.stop_kinds, vec![&TFJOB]);
        assert_eq!(c.start_backends, vec![BackendKind::Volcano]);
        assert_eq!(c.stop_backends, vec![BackendKind::SchedulerPlugins]);
    }

    #[test]
    fn the_first_discovery_starts_everything_served() {
        let all = served(
            &[&PYTORCHJOB, &MPIJOB_V2BETA1],
            &[BackendKind::SchedulerPlugins, BackendKind::Volcano],
        );
        let c = changes(&Served::default(), &all);
        assert_eq!(c.start_kinds, vec![&PYTORCHJOB, &MPIJOB_V2BETA1]);
        assert_eq!(c.start_backends.len(), 2);
        assert!(c.stop_kinds.is_empty() && c.stop_backends.is_empty());
    }

    #[test]
    fn an_mpijob_version_swap_stops_one_and_starts_the_other() {
        let c = changes(
            &served(&[&MPIJOB_V1], &[]),
            &served(&[&MPIJOB_V2BETA1], &[]),
        );
        assert_eq!(
            (c.start_kinds, c.stop_kinds),
            (vec![&MPIJOB_V2BETA1], vec![&MPIJOB_V1])
        );
    }

    #[test]
    fn rule_12_kueue_workloads_are_watched_while_served() {
        let without = served(&[&PYTORCHJOB], &[]);
        let with = Served {
            kueue: true,
            ..without.clone()
        };
        assert_eq!(changes(&without, &with).kueue, Some(true));
        assert_eq!(changes(&with, &without).kueue, Some(false));
        assert_eq!(changes(&with, &with).kueue, None);
    }

    #[test]
    fn rule_13_hyper_nodes_are_watched_while_served() {
        let without = served(&[&PYTORCHJOB], &[BackendKind::Volcano]);
        let with = Served {
            hyper_nodes: true,
            ..without.clone()
        };
        assert_eq!(changes(&without, &with).hyper_nodes, Some(true));
        assert_eq!(changes(&with, &without).hyper_nodes, Some(false));
        assert_eq!(changes(&with, &with), Changes::default());
    }

    #[test]
    fn discovery_retries_back_off_from_one_to_four_seconds() {
        let secs: Vec<u64> = (1..=5).map(|n| discovery_retry(n).as_secs()).collect();
        assert_eq!(secs, vec![1, 2, 4, 4, 4]);
    }
}

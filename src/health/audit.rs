//! The stale-PodGroup audit (SPEC §10), decided from the caches alone.
//!
//! A PodGroup is stale when its job is gone or finished. podgroup-sync's own (the managed-by
//! label) are deleted — a delete missed while the controller was down, or a job deleted with
//! orphan propagation (which strips the ownerReference). Others are only reported: they are
//! not ours. Only owners of the job kinds podgroup-sync watches are looked up; a PodGroup
//! controlled by anything else is not judged (looking its owner up would cost a request).

use k8s_openapi::jiff::Timestamp;
use kube::{Resource, ResourceExt};

use crate::backend::{BackendKind, MANAGED_BY_LABEL, MANAGED_BY_VALUE, made_by};
use crate::packed::Labelled;

/// What the job caches say about a PodGroup's controller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Owner {
    /// Its kind is not watched (or not a job kind): not judged.
    NotWatched,
    Absent,
    Found {
        uid: String,
        finished: bool,
    },
}

/// The job caches, as the audit sees them.
pub trait Jobs {
    fn owner(&self, api_version: &str, kind: &str, namespace: &str, name: &str) -> Owner;
}

/// Why a PodGroup is stale.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Stale {
    /// Its controller job no longer exists (or was recreated with another UID).
    OwnerDeleted,
    /// Its controller job finished (Succeeded or Failed).
    OwnerFinished,
    /// Ours, with no controller reference left (the job was deleted with orphan propagation).
    NoOwner,
}

impl Stale {
    pub const ALL: [Stale; 3] = [Stale::OwnerDeleted, Stale::OwnerFinished, Stale::NoOwner];

    pub fn as_str(&self) -> &'static str {
        match self {
            Stale::OwnerDeleted => "owner_deleted",
            Stale::OwnerFinished => "owner_finished",
            Stale::NoOwner => "no_owner",
        }
    }
}

/// One stale PodGroup.
#[derive(Debug, Clone, PartialEq)]
pub struct Finding {
    pub backend: BackendKind,
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// Made by podgroup-sync: deleted. Otherwise only reported.
    pub ours: bool,
    pub reason: Stale,
    /// The controller, as `Kind name (uid …)`, when there is one.
    pub owner: Option<String>,
}

impl Finding {
    /// What became of the PodGroup's controller, for an Event's note.
    fn what(&self) -> (&str, &'static str) {
        let owner = self.owner.as_deref().unwrap_or("its owner");
        let what = match self.reason {
            Stale::OwnerDeleted => "no longer exists",
            Stale::OwnerFinished => "has finished",
            Stale::NoOwner => "is unknown",
        };
        (owner, what)
    }

    /// The note of the Normal Event on a stale PodGroup of ours in a dry-run namespace.
    pub fn dry_run_note(&self) -> String {
        let (owner, what) = self.what();
        format!(
            "{} PodGroup {} is stale: its controller {owner} {what}. podgroup-sync would delete it; the namespace is in dry-run mode, so it is left in place",
            self.backend, self.name
        )
    }

    /// The note of the Warning Event on a stale PodGroup that is not ours.
    pub fn note(&self) -> String {
        let (owner, what) = self.what();
        format!(
            "{} PodGroup {} is stale: its controller {owner} {what}. It was not made by podgroup-sync, which leaves it in place; while it exists it may hold scheduler queue quota (delete it, or have its maker do so)",
            self.backend, self.name
        )
    }
}

/// What the audit needs besides the caches.
#[derive(Debug, Clone, Copy)]
pub struct Rules<'a> {
    /// Finished jobs keep the PodGroups podgroup-sync made for them (`--keep-finished`).
    pub keep_finished: bool,
    /// This installation (`--instance`): its PodGroups are ours; another installation's are
    /// not judged at all (that installation audits its own).
    pub instance: &'a str,
    /// PodGroups created after this are not judged yet: their job may not have reached the job
    /// cache (an operator that makes both makes them within milliseconds).
    pub created_before: Timestamp,
}

/// The stale PodGroups among `pod_groups`.
/// Only metadata is read, so the caches' packed PodGroups are judged as they are.
pub fn audit<'a, K: Resource + Labelled + 'a>(
    pod_groups: impl IntoIterator<Item = (BackendKind, &'a K)>,
    jobs: &dyn Jobs,
    rules: Rules,
) -> Vec<Finding> {
    let keep_finished = rules.keep_finished;
    let mut findings = Vec::new();
    for (backend, pg) in pod_groups {
        let young = pg
            .meta()
            .creation_timestamp
            .as_ref()
            .is_none_or(|t| t.0 > rules.created_before);
        if pg.meta().deletion_timestamp.is_some() || young {
            continue;
        }
        let ours = made_by(pg, rules.instance);
        let another_installations = !ours && pg.label(MANAGED_BY_LABEL) == Some(MANAGED_BY_VALUE);
        if another_installations {
            continue;
        }
        let namespace = pg.namespace().unwrap_or_default();
        let controller = pg
            .owner_references()
            .iter()
            .find(|o| o.controller == Some(true));
        let (reason, owner) = match controller {
            None if ours => (Stale::NoOwner, None),
            None => continue,
            Some(o) => {
                let reason = match jobs.owner(&o.api_version, &o.kind, &namespace, &o.name) {
                    Owner::NotWatched => continue,
                    Owner::Absent => Stale::OwnerDeleted,
                    Owner::Found { uid, .. } if uid != o.uid => Stale::OwnerDeleted,
                    Owner::Found { finished: true, .. } if !(ours && keep_finished) => {
                        Stale::OwnerFinished
                    }
                    Owner::Found { .. } => continue,
                };
                (
                    reason,
                    Some(format!("{} {} (uid {})", o.kind, o.name, o.uid)),
                )
            }
        };
        findings.push(Finding {
            backend,
            namespace,
            name: pg.name_any(),
            uid: pg.uid().unwrap_or_default(),
            ours,
            reason,
            owner,
        });
    }
    findings
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde_json::{Value, json};

    use super::*;
    use kube::api::DynamicObject;

    struct Cached(BTreeMap<String, Owner>);

    impl Jobs for Cached {
        fn owner(&self, api_version: &str, kind: &str, _ns: &str, name: &str) -> Owner {
            if api_version != "kubeflow.org/v1" {
                return Owner::NotWatched;
            }
            self.0
                .get(&format!("{kind}/{name}"))
                .cloned()
                .unwrap_or(Owner::Absent)
        }
    }

    fn pg(name: &str, ours: bool, owner: Option<(&str, &str, &str)>) -> DynamicObject {
        let mut v = json!({"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
            "metadata": {"name": name, "namespace": "ns", "uid": format!("pg-{name}"),
                "creationTimestamp": "2026-12-01T00:00:00Z"}});
        if ours {
            v["metadata"]["labels"] = json!({MANAGED_BY_LABEL: MANAGED_BY_VALUE});
        }
        if let Some((api_version, kind, uid)) = owner {
            v["metadata"]["ownerReferences"] = json!([{"apiVersion": api_version, "kind": kind,
                "name": name, "uid": uid, "controller": true}]);
        }
        serde_json::from_value::<DynamicObject>(v).unwrap()
    }

    fn reasons(found: &[Finding]) -> Vec<(String, bool, Stale)> {
        found
            .iter()
            .map(|f| (f.name.clone(), f.ours, f.reason))
            .collect()
    }

    #[test]
    fn another_installations_pod_groups_are_not_judged() {
        let jobs = Cached(BTreeMap::new());
        let mut theirs = pg(
            "theirs",
            true,
            Some(("kubeflow.org/v1", "PyTorchJob", "gone")),
        );
        theirs
            .metadata
            .labels
            .get_or_insert_with(Default::default)
            .insert(crate::backend::INSTANCE_LABEL.into(), "team-b".into());
        let mine = pg(
            "mine",
            true,
            Some(("kubeflow.org/v1", "PyTorchJob", "gone")),
        );
        let found = audit(
            [
                (BackendKind::SchedulerPlugins, &theirs),
                (BackendKind::SchedulerPlugins, &mine),
            ],
            &jobs,
            rules(false),
        );
        assert_eq!(
            reasons(&found),
            [("mine".to_string(), true, Stale::OwnerDeleted)]
        );
        let team_b = Rules {
            instance: "team-b",
            ..rules(false)
        };
        let found = audit(
            [
                (BackendKind::SchedulerPlugins, &theirs),
                (BackendKind::SchedulerPlugins, &mine),
            ],
            &jobs,
            team_b,
        );
        assert_eq!(
            reasons(&found),
            [("theirs".to_string(), true, Stale::OwnerDeleted)]
        );
    }

    #[test]
    fn rule_10_stale_pod_groups_are_found_from_the_caches() {
        let jobs = Cached(
            [
                (
                    "PyTorchJob/live".into(),
                    Owner::Found {
                        uid: "u-live".into(),
                        finished: false,
                    },
                ),
                (
                    "PyTorchJob/done".into(),
                    Owner::Found {
                        uid: "u-done".into(),
                        finished: true,
                    },
                ),
                (
                    "PyTorchJob/again".into(),
                    Owner::Found {
                        uid: "u-new".into(),
                        finished: false,
                    },
                ),
            ]
            .into(),
        );
        let kf = "kubeflow.org/v1";
        let pgs = [
            pg("live", true, Some((kf, "PyTorchJob", "u-live"))),
            pg("done", true, Some((kf, "PyTorchJob", "u-done"))),
            pg("gone", true, Some((kf, "PyTorchJob", "u-gone"))),
            pg("again", false, Some((kf, "PyTorchJob", "u-old"))),
            pg("orphan", true, None),
            pg("mine", false, None),
            pg("ray", false, Some(("ray.io/v1", "RayCluster", "u-ray"))),
        ];
        let found = audit(
            pgs.iter().map(|p| (BackendKind::SchedulerPlugins, p)),
            &jobs,
            rules(false),
        );
        assert_eq!(
            reasons(&found),
            [
                ("done".into(), true, Stale::OwnerFinished),
                ("gone".into(), true, Stale::OwnerDeleted),
                ("again".into(), false, Stale::OwnerDeleted),
                ("orphan".into(), true, Stale::NoOwner),
            ]
        );
        assert!(
            found[2]
                .note()
                .contains("PyTorchJob again (uid u-old) no longer exists")
        );
        // --keep-finished keeps ours; a foreign one of a finished job is still reported.
        let pgs = [
            pg("done", true, Some((kf, "PyTorchJob", "u-done"))),
            pg("done", false, Some((kf, "PyTorchJob", "u-done"))),
        ];
        let found = audit(
            pgs.iter().map(|p| (BackendKind::Volcano, p)),
            &jobs,
            rules(true),
        );
        assert_eq!(
            reasons(&found),
            [("done".into(), false, Stale::OwnerFinished)]
        );
    }

    fn rules(keep_finished: bool) -> Rules<'static> {
        Rules {
            keep_finished,
            instance: "",
            created_before: "2026-12-01T00:01:00Z".parse().unwrap(),
        }
    }

    #[test]
    fn rule_10_a_pod_group_being_deleted_or_just_created_is_not_judged() {
        let mut p = pg("gone", true, Some(("kubeflow.org/v1", "PyTorchJob", "u")));
        p.metadata.deletion_timestamp =
            serde_json::from_value::<Value>(json!("2026-01-01T00:00:00Z"))
                .ok()
                .and_then(|v| serde_json::from_value(v).ok());
        let none = Cached(BTreeMap::new());
        assert!(audit([(BackendKind::Kubernetes, &p)], &none, rules(false)).is_empty());
        // Created after the cut-off: its job may not be in the cache yet.
        let young = pg("gone", false, Some(("kubeflow.org/v1", "PyTorchJob", "u")));
        let mut early = rules(false);
        early.created_before = "2026-11-30T23:59:00Z".parse().unwrap();
        assert!(audit([(BackendKind::Volcano, &young)], &none, early).is_empty());
        assert_eq!(
            audit([(BackendKind::Volcano, &young)], &none, rules(false)).len(),
            1
        );
    }
}

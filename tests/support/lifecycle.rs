//! The rows of SPEC §4 as steps on one job, shared by the lifecycle tests (every kind × backend)
//! and the chart test (the same steps with only the chart's ServiceAccount).

use kube::Client;
use kube::api::DynamicObject;
use serde_json::{Value, json};

use super::jobs::{self, Backend, Kind, expected_spec_of, spec, wait_pg, wait_pg_gone};

/// The rows of SPEC §4 that one job goes through after its creation.
#[derive(Debug, Clone, Copy)]
pub enum Row {
    Created,
    SpecChanged,
    DeletedBySomeone,
    SuspendedAndResumed,
    Finished,
    JobDeleted,
}

/// One job `name` of `kind` for `backend` in `ns`, whose controller logs are `log()`.
pub struct Gang<'a> {
    pub client: &'a Client,
    pub ns: &'a str,
    pub kind: Kind,
    pub backend: Backend,
    pub name: &'a str,
    pub log: &'a (dyn Fn() -> String + Sync),
}

impl Gang<'_> {
    /// Creates the job (itself the first row's check), then takes it through `row`.
    pub async fn through(&self, row: Row) {
        let pg = self.created().await;
        match row {
            Row::Created => {}
            Row::SpecChanged => {
                let scaled = self.scaled().await;
                assert_eq!(
                    scaled.metadata.uid, pg.metadata.uid,
                    "{:?}/{:?}: resized by recreating",
                    self.kind, self.backend
                );
            }
            Row::DeletedBySomeone => self.recreated_after_a_manual_delete(&pg).await,
            Row::SuspendedAndResumed => {
                self.scaled().await;
                self.suspended_then_resumed(3).await;
            }
            Row::Finished => self.finished().await,
            Row::JobDeleted => self.garbage_collected().await,
        }
    }

    /// Row "job created": the exact PodGroup, owned by the job, labelled, applied by our field
    /// manager. The job has 2 workers.
    pub async fn created(&self) -> DynamicObject {
        let (client, ns, kind, backend) = (self.client, self.ns, self.kind, self.backend);
        let job = jobs::create(client, ns, kind, &jobs::job(kind, backend, self.name, 2)).await;
        let pg = wait_pg(client, ns, backend, self.name, "created", |_| true).await;
        assert_eq!(
            spec(&pg),
            expected_spec_of(kind, backend, 2),
            "{kind:?}/{backend:?}\n{}",
            (self.log)()
        );
        assert_eq!(
            serde_json::to_value(&pg.metadata.owner_references).unwrap(),
            owner_ref_of(&job)
        );
        let labels = pg.metadata.labels.clone().unwrap_or_default();
        assert_eq!(
            labels
                .get("app.kubernetes.io/managed-by")
                .map(String::as_str),
            Some("podgroup-sync")
        );
        let managers = field_managers(&pg);
        assert!(
            managers.contains(&"podgroup-sync".to_string()),
            "{managers:?}"
        );
        pg
    }

    /// Row "job spec changes": 3 workers, and the PodGroup follows.
    pub async fn scaled(&self) -> DynamicObject {
        jobs::patch(
            self.client,
            self.ns,
            self.kind,
            self.name,
            self.kind.scale(3),
            false,
        )
        .await;
        let want = self.spec(3);
        wait_pg(
            self.client,
            self.ns,
            self.backend,
            self.name,
            "scaled to 3 workers",
            |pg| spec(pg) == want,
        )
        .await
    }

    /// Row "PodGroup deleted by someone while the job is active": recreated promptly.
    pub async fn recreated_after_a_manual_delete(&self, pg: &DynamicObject) {
        jobs::delete(self.client, self.ns, &self.backend.ar(), self.name).await;
        let old_uid = pg.metadata.uid.clone();
        wait_pg(
            self.client,
            self.ns,
            self.backend,
            self.name,
            "recreated after a manual delete",
            |p| p.metadata.uid != old_uid,
        )
        .await;
    }

    /// Row "job suspended": deleted; recreated with the job's current size on resume.
    pub async fn suspended_then_resumed(&self, workers: u32) {
        self.patch(self.kind.suspend(true), false).await;
        wait_pg_gone(
            self.client,
            self.ns,
            self.backend,
            self.name,
            "job suspended",
        )
        .await;
        self.patch(self.kind.suspend(false), false).await;
        let want = self.spec(workers);
        wait_pg(
            self.client,
            self.ns,
            self.backend,
            self.name,
            "recreated on resume",
            |pg| spec(pg) == want,
        )
        .await;
    }

    /// Row "job condition Succeeded": the PodGroup goes (a stale Volcano PodGroup would hold
    /// queue quota).
    pub async fn finished(&self) {
        let Some(finish) = self.kind.finish() else {
            return;
        };
        self.patch(finish, true).await;
        wait_pg_gone(
            self.client,
            self.ns,
            self.backend,
            self.name,
            "job Succeeded",
        )
        .await;
    }

    /// Row "job deleted": kube-controller-manager's garbage collector removes the PodGroup.
    pub async fn garbage_collected(&self) {
        jobs::delete(self.client, self.ns, &self.kind.ar(), self.name).await;
        wait_pg_gone(
            self.client,
            self.ns,
            self.backend,
            self.name,
            "garbage-collected after the job was deleted",
        )
        .await;
    }

    /// Every row in turn on one job.
    pub async fn whole_lifecycle(&self) {
        self.created().await;
        let pg = self.scaled().await;
        self.recreated_after_a_manual_delete(&pg).await;
        self.suspended_then_resumed(3).await;
        self.finished().await;
        self.garbage_collected().await;
    }

    fn spec(&self, workers: u32) -> Value {
        expected_spec_of(self.kind, self.backend, workers)
    }

    async fn patch(&self, patch: Value, status: bool) {
        jobs::patch(self.client, self.ns, self.kind, self.name, patch, status).await;
    }
}

/// The ownerReference a PodGroup of `job` must carry.
/// The field managers that wrote `o` (its managedFields).
pub fn field_managers(o: &DynamicObject) -> Vec<String> {
    let fields = o.metadata.managed_fields.iter().flatten();
    fields.filter_map(|m| m.manager.clone()).collect()
}

pub fn owner_ref_of(job: &DynamicObject) -> Value {
    json!([{
        "apiVersion": job.types.as_ref().unwrap().api_version,
        "kind": job.types.as_ref().unwrap().kind,
        "name": job.metadata.name,
        "uid": job.metadata.uid,
        "controller": true,
        "blockOwnerDeletion": true,
    }])
}

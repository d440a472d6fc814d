//! Reasons to look at jobs again, sent by the context caches to every job kind's controller,
//! and their translation into the job references one controller reconciles.

use futures::{Stream, StreamExt};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Resource, ResourceExt};
use tokio::sync::broadcast;

use crate::job::JobKind;
use crate::packed::Packed;

/// A reason to look at jobs again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Trigger {
    /// Everything in a namespace (its annotations or LimitRanges changed).
    Namespace(String),
    /// Every job (a PriorityClass, RuntimeClass or served backend changed, or a cache relisted).
    All,
    /// One job, named by a PodGroup's controller reference.
    Job {
        api_version: String,
        kind: String,
        namespace: String,
        name: String,
    },
}

/// The job a PodGroup's controller reference names.
pub fn owner_trigger(pg: &impl Resource) -> Option<Trigger> {
    let owner = pg
        .meta()
        .owner_references
        .as_ref()?
        .iter()
        .find(|o| o.controller == Some(true))?;
    Some(Trigger::Job {
        api_version: owner.api_version.clone(),
        kind: owner.kind.clone(),
        namespace: pg.namespace()?,
        name: owner.name.clone(),
    })
}

/// Turns triggers into the job references one kind's controller should reconcile.
pub fn job_refs(
    triggers: broadcast::Receiver<Trigger>,
    jobs: Store<Packed>,
    kind: &'static JobKind,
    ar: crate::packed::Kind,
) -> impl Stream<Item = ObjectRef<Packed>> + Send + 'static {
    receiver_stream(triggers).flat_map(move |t| {
        let refs: Vec<ObjectRef<Packed>> = match t {
            Some(Trigger::Job {
                api_version,
                kind: k,
                namespace,
                name,
            }) if k == kind.kind && api_version == kind.api_version() => {
                vec![ObjectRef::new_with(&name, ar.clone()).within(&namespace)]
            }
            Some(Trigger::Job { .. }) => vec![],
            Some(Trigger::Namespace(ns)) => jobs
                .state()
                .iter()
                .filter(|j| j.meta().namespace.as_deref() == Some(ns.as_str()))
                .map(|j| ObjectRef::from_obj_with(j.as_ref(), ar.clone()))
                .collect(),
            // `None`: the receiver lagged and lost triggers; look at everything.
            Some(Trigger::All) | None => jobs
                .state()
                .iter()
                .map(|j| ObjectRef::from_obj_with(j.as_ref(), ar.clone()))
                .collect(),
        };
        futures::stream::iter(refs)
    })
}

/// A broadcast receiver as a stream; a lag becomes `None` ("you missed something").
fn receiver_stream(rx: broadcast::Receiver<Trigger>) -> impl Stream<Item = Option<Trigger>> + Send {
    futures::stream::unfold(rx, |mut rx| async move {
        match rx.recv().await {
            Ok(t) => Some((Some(t), rx)),
            Err(broadcast::error::RecvError::Lagged(_)) => Some((None, rx)),
            Err(broadcast::error::RecvError::Closed) => None,
        }
    })
}

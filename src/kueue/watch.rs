//! The Workload watch: keeps [`Admissions`] and sends each job whose Workload changed to its
//! kind's controller (SPEC §12). Nothing of a Workload is kept but what [`super::read`] takes.

use std::collections::HashMap;
use std::sync::Arc;

use futures::StreamExt;
use kube::api::DynamicObject;
use kube::runtime::watcher;
use kube::runtime::{WatchStreamExt, watcher::Event};
use kube::{Api, Client};
use tokio::sync::broadcast;
use tokio::task::JoinHandle;

use super::{Admission, Admissions, JobWorkloads, read_named, workload_resource};
use crate::liveness::Probe;
use crate::metrics::Metrics;
use crate::trigger::{Trigger, owner_trigger};
use crate::watch::{WatchBackoff, observe};

/// The liveness name of the Workload watch.
pub const RESOURCE: &str = "workloads.kueue.x-k8s.io/v1beta2";

/// A Workload as the index and the trigger need it: read in place, never serialized again.
fn entry(w: &DynamicObject) -> Option<(String, Admission, Option<Trigger>)> {
    let owner = w
        .metadata
        .owner_references
        .as_ref()?
        .iter()
        .find(|o| o.controller == Some(true))?;
    let name = w.metadata.name.as_deref().unwrap_or_default();
    Some((
        owner.uid.clone(),
        read_named(name, &w.data),
        owner_trigger(w),
    ))
}

/// Watches Workloads until aborted.
pub fn spawn(
    client: Client,
    admissions: Admissions,
    triggers: broadcast::Sender<Trigger>,
    probe: Probe,
    metrics: Arc<Metrics>,
) -> JoinHandle<()> {
    let api: Api<DynamicObject> = Api::all_with(client, &workload_resource());
    let stream = watcher(api, watcher::Config::default()).backoff(WatchBackoff::default());
    tokio::spawn(async move {
        let _guard = probe.task_guard();
        let mut stream = std::pin::pin!(stream);
        // The jobs of the Workloads seen, to trigger them when a relist drops their Workload.
        let mut owners: HashMap<String, Trigger> = HashMap::new();
        let mut fresh: HashMap<String, JobWorkloads> = HashMap::new();
        let mut fresh_owners: HashMap<String, Trigger> = HashMap::new();
        while let Some(ev) = stream.next().await {
            observe(&probe, &metrics, &ev);
            let Ok(ev) = ev else { continue };
            let send = |t: Option<Trigger>| {
                if let Some(t) = t {
                    let _ = triggers.send(t);
                }
            };
            match ev {
                Event::Apply(w) => {
                    if let Some((uid, a, t)) = entry(&w) {
                        if let Some(t) = &t {
                            owners.insert(uid.clone(), t.clone());
                        }
                        if admissions.insert(&uid, a) {
                            send(t);
                        }
                    }
                }
                Event::Delete(w) => {
                    if let Some((uid, a, t)) = entry(&w) {
                        admissions.remove(&uid, &a.workload);
                        if admissions.all(&uid).is_none() {
                            owners.remove(&uid);
                        }
                        send(t);
                    }
                }
                Event::Init => {
                    fresh.clear();
                    fresh_owners.clear();
                }
                Event::InitApply(w) => {
                    if let Some((uid, a, t)) = entry(&w) {
                        if let Some(t) = t {
                            fresh_owners.insert(uid.clone(), t);
                        }
                        fresh
                            .entry(uid)
                            .or_default()
                            .insert(a.workload.clone(), Arc::new(a));
                    }
                }
                Event::InitDone => {
                    // Every job whose Workloads the list changed is looked at again.
                    let changed: Vec<String> = owners
                        .keys()
                        .chain(fresh_owners.keys())
                        .filter(|uid| {
                            let before = admissions.all(uid);
                            before.as_ref() != fresh.get(*uid)
                        })
                        .cloned()
                        .collect();
                    admissions.replace(std::mem::take(&mut fresh));
                    for uid in changed {
                        send(fresh_owners.get(&uid).or(owners.get(&uid)).cloned());
                    }
                    owners = std::mem::take(&mut fresh_owners);
                }
            }
        }
    })
}

//! `podgroup-sync status NAMESPACE/NAME`: reads the job, its PodGroup, its pods and the Events
//! around them (GETs and lists, once), and prints them with what blocks the job
//! ([`crate::explain::status`] renders).

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{Event, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::api::ListParams;
use kube::{Api, ResourceExt};

use super::StatusArgs;
use super::explain::{compared, one_off_client};
use crate::explain::status::{EventLine, PodState, StatusInput, render};
use crate::webhook::link::{self, PodView};

pub fn run_status(args: StatusArgs) -> std::process::ExitCode {
    let result = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
        .block_on(status(&args));
    match result {
        Ok(out) => {
            print!("{out}");
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("podgroup-sync status: {e}");
            std::process::ExitCode::from(1)
        }
    }
}

async fn status(args: &StatusArgs) -> Result<String, String> {
    let client = one_off_client(args.kubeconfig.as_ref()).await?;
    let opts = args.backend_args.options();
    let c = compared(
        &client,
        &args.job,
        args.backend,
        &opts,
        &args.annotation_key,
    )
    .await?;
    let e = &c.explained;
    let namespace = e.job.namespace.clone();
    let pods = pods_of(&client, &namespace, e).await?;
    let mut names: BTreeSet<String> = pods.iter().map(|p| p.name.clone()).collect();
    names.insert(e.job.name.clone());
    if let Some(pg) = e.object["metadata"]["name"].as_str() {
        names.insert(pg.to_string());
    }
    let events = events_of(&client, &namespace, &names, args.events).await?;
    Ok(render(&StatusInput {
        explained: e,
        comparison: &c.comparison,
        pod_group: c.actual.as_ref(),
        pods: &pods,
        events: &events,
    }))
}

/// The pods whose controller chain leads to the job (the operator's name label selects them).
async fn pods_of(
    client: &kube::Client,
    namespace: &str,
    e: &crate::explain::Explained,
) -> Result<Vec<PodState>, String> {
    let kind = e.job.kind;
    let lp = ListParams::default().labels(&format!("{}={}", kind.pod_label, e.job.name));
    let pods = Api::<Pod>::namespaced(client.clone(), namespace)
        .list(&lp)
        .await
        .map_err(|err| format!("listing the job's pods: {err}"))?;
    let key = e.backend.backend().link_key();
    let mut out = Vec::new();
    for pod in pods.items {
        let owners = pod.metadata.owner_references.clone().unwrap_or_default();
        let view = PodView {
            name: pod.metadata.name.as_deref(),
            labels: pod.metadata.labels.as_ref(),
            annotations: pod.metadata.annotations.as_ref(),
            owner_references: &owners,
            scheduler_name: None,
            scheduling_group: false,
        };
        let mine =
            link::owner_of(&view).is_ok_and(|o| o.kind.kind == kind.kind && o.name == e.job.name);
        if !mine {
            continue;
        }
        let status = pod.status.as_ref();
        let unschedulable = status
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| {
                cs.iter()
                    .find(|c| c.type_ == "PodScheduled" && c.status == "False")
            })
            .map(|c| c.message.clone().unwrap_or_default());
        out.push(PodState {
            name: pod.name_any(),
            phase: status
                .and_then(|s| s.phase.clone())
                .unwrap_or_else(|| "Pending".into()),
            node: pod.spec.as_ref().and_then(|s| s.node_name.clone()),
            linked: view.has_link_in_metadata(key),
            unschedulable,
        });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// The newest `keep` Events about any of `names` (the job, its PodGroup, its pods), oldest first.
async fn events_of(
    client: &kube::Client,
    namespace: &str,
    names: &BTreeSet<String>,
    keep: usize,
) -> Result<Vec<EventLine>, String> {
    let events = Api::<Event>::namespaced(client.clone(), namespace)
        .list(&ListParams::default().limit(2000))
        .await
        .map_err(|err| format!("listing the namespace's Events: {err}"))?;
    let now = Timestamp::now().as_second();
    let mut lines: Vec<(i64, EventLine)> = events
        .items
        .into_iter()
        .filter(|ev| {
            ev.involved_object
                .name
                .as_ref()
                .is_some_and(|n| names.contains(n))
        })
        .map(|ev| {
            let when = ev
                .last_timestamp
                .as_ref()
                .map(|t| t.0)
                .or(ev.event_time.as_ref().map(|t| t.0))
                .or(ev.first_timestamp.as_ref().map(|t| t.0))
                .or(ev.metadata.creation_timestamp.as_ref().map(|t| t.0));
            let stamp = when.map(|w| w.as_second()).unwrap_or(0);
            let object = format!(
                "{}/{}",
                ev.involved_object.kind.clone().unwrap_or_default(),
                ev.involved_object.name.clone().unwrap_or_default()
            );
            let line = EventLine {
                ago_seconds: when.map(|w| now - w.as_second()),
                type_: ev.type_.unwrap_or_default(),
                reason: ev.reason.unwrap_or_default(),
                object,
                message: ev.message.unwrap_or_default(),
                count: ev.count.unwrap_or(1),
            };
            (stamp, line)
        })
        .collect();
    lines.sort_by_key(|(stamp, _)| *stamp);
    let skip = lines.len().saturating_sub(keep);
    Ok(lines.into_iter().skip(skip).map(|(_, l)| l).collect())
}

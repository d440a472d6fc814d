//! Planner rows of SPEC §13: a topology request → each backend's PodGroup, what it cannot
//! express, and the native PodGroup's immutable fields.

use serde_json::{Value, json};

use super::*;
use crate::topology::{DISRUPTION_MODE, POD_SET_LABEL, PREFERRED, REQUIRED, SLICE_LABEL};
use crate::topology::{SLICE_REQUIRED, SLICE_SIZE};

const RACK: &str = "topology.example.com/rack";
const BLOCK: &str = "topology.example.com/block";

/// The PyTorchJob `train` of `workers` workers on `backend`, with these job and Worker template
/// annotations.
fn topology_job(backend: &str, workers: u64, on_job: Value, on_worker: Value) -> Value {
    let mut j = job(workers);
    let mut annotations = json!({"podgroup-sync.io/backend": backend});
    for (k, v) in on_job.as_object().unwrap() {
        annotations[k] = v.clone();
    }
    j["metadata"]["annotations"] = annotations;
    j["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["metadata"]["annotations"] = on_worker;
    j
}

fn served_all() -> Cached {
    Cached {
        served: [
            BackendKind::SchedulerPlugins,
            BackendKind::Volcano,
            BackendKind::Kubernetes,
        ]
        .into(),
        ..Cached::default()
    }
}

fn with_webhook() -> Settings {
    let mut s = settings();
    s.webhook = true;
    s.backend_options.pods_labelled = true;
    s
}

fn plan_of(job: &Value, pgs: &Cached, s: &Settings) -> Plan {
    plan_with(job, Some(&annotations("true")), pgs, s)
}

fn note(p: &Plan) -> Option<&str> {
    p.events
        .iter()
        .find(|(r, _)| *r == Reason::TopologyNotEnforced)
        .map(|(_, m)| m.as_str())
}

fn slices_of_8() -> Value {
    json!({SLICE_REQUIRED: RACK, SLICE_SIZE: "8"})
}

#[test]
fn rule_13_volcano_slices_are_a_sub_group_policy_of_every_slice() {
    let j = topology_job("volcano", 16, json!({}), slices_of_8());
    let p = plan_of(&j, &served_all(), &with_webhook());
    let w = p.write().expect("a create");
    assert_eq!(w.body["spec"]["minMember"], 16);
    assert_eq!(w.body["spec"].get("networkTopology"), None);
    assert_eq!(
        w.body["spec"]["subGroupPolicy"],
        json!([{
            "name": "worker",
            "subGroupSize": 8,
            "minSubGroups": 2,
            "labelSelector": {"matchLabels": {POD_SET_LABEL: "Worker"}},
            "matchLabelKeys": [SLICE_LABEL],
            "networkTopology": {"mode": "hard", "highestTierName": RACK},
        }])
    );
    assert_eq!(note(&p), None, "everything is enforced");
    // The whole gang in one block besides: the PodGroup's own networkTopology.
    let j = topology_job("volcano", 16, json!({REQUIRED: BLOCK}), slices_of_8());
    let w = plan_of(&j, &served_all(), &with_webhook()).write().cloned();
    let spec = &w.unwrap().body["spec"];
    assert_eq!(
        spec["networkTopology"],
        json!({"mode": "hard", "highestTierName": BLOCK})
    );
    assert_eq!(spec["subGroupPolicy"][0]["minSubGroups"], 2);
}

#[test]
fn rule_13_volcano_minimum_slices_follow_the_counted_pods() {
    // minAvailable 12 of 16 in slices of 4: the gang counts 12 pods, i.e. 3 whole slices.
    let mut j = topology_job(
        "volcano",
        16,
        json!({}),
        json!({SLICE_REQUIRED: RACK, SLICE_SIZE: "4"}),
    );
    j["spec"]["runPolicy"] = json!({"schedulingPolicy": {"minAvailable": 12}});
    let w = plan_of(&j, &served_all(), &with_webhook()).write().cloned();
    let spec = &w.unwrap().body["spec"];
    assert_eq!(spec["minMember"], 12);
    assert_eq!(spec["subGroupPolicy"][0]["minSubGroups"], 3);
    // 10 of 16: 2.5 slices → 3 (a slice the gang needs part of is needed).
    j["spec"]["runPolicy"] = json!({"schedulingPolicy": {"minAvailable": 10}});
    let w = plan_of(&j, &served_all(), &with_webhook()).write().cloned();
    assert_eq!(
        w.unwrap().body["spec"]["subGroupPolicy"][0]["minSubGroups"],
        3
    );
}

#[test]
fn rule_13_volcano_without_the_webhook_gets_no_selector_that_matches_no_pod() {
    let j = topology_job("volcano", 16, json!({PREFERRED: BLOCK}), slices_of_8());
    let p = plan_of(&j, &served_all(), &settings());
    let spec = &p.write().expect("a create").body["spec"];
    assert_eq!(spec.get("subGroupPolicy"), None);
    assert_eq!(
        spec["networkTopology"],
        json!({"mode": "soft", "highestTierName": BLOCK}),
        "the gang's own domain needs no pod label"
    );
    let n = note(&p).expect("a note");
    assert!(
        n.contains("pod-link webhook") && n.contains("Worker"),
        "{n}"
    );
}

#[test]
fn rule_13_volcano_sets_that_disagree_get_a_sub_group_each() {
    let mut j = topology_job("volcano", 4, json!({}), json!({REQUIRED: RACK}));
    j["spec"]["pytorchReplicaSpecs"]["Master"] = super::worker(1);
    let p = plan_of(&j, &served_all(), &with_webhook());
    let spec = &p.write().expect("a create").body["spec"];
    assert_eq!(
        spec.get("networkTopology"),
        None,
        "the Master asks for none"
    );
    assert_eq!(
        spec["subGroupPolicy"],
        json!([{
            "name": "worker",
            "subGroupSize": 4,
            "minSubGroups": 1,
            "labelSelector": {"matchLabels": {POD_SET_LABEL: "Worker"}},
            "matchLabelKeys": [POD_SET_LABEL],
            "networkTopology": {"mode": "hard", "highestTierName": RACK},
        }])
    );
    assert_eq!(note(&p), None);
}

#[test]
fn rule_13_native_required_domain_and_disruption_mode_at_creation() {
    let j = topology_job(
        "kubernetes",
        4,
        json!({REQUIRED: RACK, DISRUPTION_MODE: "All"}),
        json!({}),
    );
    let p = plan_of(&j, &served_all(), &with_webhook());
    let w = p.write().expect("a create");
    assert_eq!(
        w.body["spec"],
        json!({
            "schedulingPolicy": {"gang": {"minCount": 4}},
            "schedulingConstraints": {"topology": [{"key": RACK}]},
            "disruptionMode": {"all": {}},
        })
    );
    assert_eq!(note(&p), None);
}

#[test]
fn rule_13_native_cannot_express_preferences_or_slices() {
    let j = topology_job("kubernetes", 16, json!({PREFERRED: BLOCK}), slices_of_8());
    let p = plan_of(&j, &served_all(), &with_webhook());
    let spec = &p.write().expect("a create").body["spec"];
    assert_eq!(spec.get("schedulingConstraints"), None);
    let n = note(&p).expect("a note");
    assert!(n.contains("preference is not expressed"), "{n}");
    assert!(n.contains("cannot express slices"), "{n}");
}

#[test]
fn rule_13_native_constraints_are_immutable_a_later_change_is_reported_never_sent() {
    // Created without a topology; the server defaults the disruption mode.
    let plain = topology_job("kubernetes", 4, json!({}), json!({}));
    let w = plan_of(&plain, &served_all(), &with_webhook())
        .write()
        .cloned()
        .unwrap();
    let mut pg = stored(&w, json!({}));
    pg["spec"]["disruptionMode"] = json!({"single": {}});
    let cached = served_all().with(BackendKind::Kubernetes, pg);
    assert!(
        plan_of(&plain, &cached, &with_webhook()).write().is_none(),
        "the server's default is no change"
    );
    // The job now asks for a rack and to be disrupted whole: nothing is sent, both are told.
    let asks = topology_job(
        "kubernetes",
        4,
        json!({REQUIRED: RACK, DISRUPTION_MODE: "All"}),
        json!({}),
    );
    let p = plan_of(&asks, &cached, &with_webhook());
    assert!(p.write().is_none(), "{:?}", p.write());
    let warning = p
        .events
        .iter()
        .find(|(r, _)| *r == Reason::GangSpecWarning)
        .map(|(_, m)| m.clone())
        .expect("a warning");
    assert!(
        warning.contains("schedulingConstraints cannot change")
            && warning.contains("disruptionMode cannot change")
            && warning.contains(RACK),
        "{warning}"
    );
    // Scaled at the same time: only minCount is sent, the stored constraints stay.
    let scaled = topology_job("kubernetes", 5, json!({REQUIRED: RACK}), json!({}));
    let w = plan_of(&scaled, &cached, &with_webhook()).write().cloned();
    let w = w.expect("an update");
    assert_eq!(
        w.body["spec"],
        json!({"schedulingPolicy": {"gang": {"minCount": 5}}, "disruptionMode": {"single": {}}})
    );
    // Created with the rack: a replan with nothing changed writes nothing.
    let w = plan_of(&asks, &served_all(), &with_webhook())
        .write()
        .cloned()
        .unwrap();
    let cached = served_all().with(BackendKind::Kubernetes, stored(&w, json!({})));
    let p = plan_of(&asks, &cached, &with_webhook());
    assert!(p.write().is_none(), "{:?}", p.write());
    assert!(!reasons(&p).contains(&Reason::GangSpecWarning));
}

#[test]
fn rule_13_scheduler_plugins_says_once_that_nothing_is_enforced() {
    let j = topology_job(
        "scheduler-plugins",
        16,
        json!({REQUIRED: BLOCK}),
        slices_of_8(),
    );
    let p = plan_of(&j, &served_all(), &with_webhook());
    let spec = &p.write().expect("a create").body["spec"];
    assert_eq!(spec["minMember"], 16);
    let n = note(&p).expect("a note");
    assert!(
        n.contains("no topology field") && n.contains(BLOCK) && n.contains("2 slices of 8"),
        "{n}"
    );
    let events = reasons(&p);
    assert_eq!(
        events
            .iter()
            .filter(|r| **r == Reason::TopologyNotEnforced)
            .count(),
        1
    );
    // A job without a request hears nothing.
    let plain = topology_job("scheduler-plugins", 16, json!({}), json!({}));
    assert_eq!(note(&plan_of(&plain, &served_all(), &with_webhook())), None);
}

#[test]
fn rule_13_a_malformed_request_is_an_invalid_job_with_no_pod_group() {
    let j = topology_job(
        "volcano",
        16,
        json!({}),
        json!({SLICE_REQUIRED: RACK, SLICE_SIZE: "5"}),
    );
    let p = plan_of(&j, &served_all(), &with_webhook());
    assert!(p.write().is_none());
    let (r, m) = &p.events[0];
    assert_eq!(*r, Reason::InvalidSpec);
    assert!(m.contains("does not divide"), "{m}");
}

/// Plans with these fields known to be dropped by the cluster.
fn plan_dropping(job: &Value, pgs: &Cached, dropped: &[(BackendKind, &str)]) -> Plan {
    plan_full(job, pgs, dropped, &Default::default())
}

/// Plans with these fields known to be dropped and these tier numbers known.
fn plan_full(
    job: &Value,
    pgs: &Cached,
    dropped: &[(BackendKind, &str)],
    tiers: &std::sync::Arc<crate::topology::TierNumbers>,
) -> Plan {
    let obj: DynamicObject = serde_json::from_value(job.clone()).unwrap();
    let dropped: BTreeSet<(BackendKind, String)> =
        dropped.iter().map(|(b, f)| (*b, f.to_string())).collect();
    let ns = annotations("true");
    let s = with_webhook();
    plan(&Input {
        kind: &crate::kinds::PYTORCHJOB,
        job: &obj,
        leading: true,
        namespace_annotations: Some(&ns),
        priorities: &Priorities::default(),
        defaults: &Ok(AdmissionDefaults::default()),
        pod_groups: pgs,
        refused: None,
        unlinked_pods: &[],
        settings: &s,
        now: "2026-12-01T00:10:00Z".parse().unwrap(),
        health: None,
        capacity: None,
        queues: None,
        kueue: None,
        dropped: &dropped,
        tiers,
    })
}

#[test]
fn rule_13_a_field_the_cluster_drops_is_not_sent_again_and_the_job_is_told() {
    // An older Volcano CRD: subGroupPolicy is dropped. The stored PodGroup lacks it; nothing is
    // applied again, and the job hears why its slices are not enforced.
    let j = topology_job("volcano", 16, json!({}), slices_of_8());
    let w = plan_of(&j, &served_all(), &with_webhook())
        .write()
        .cloned()
        .unwrap();
    let mut pg = stored(&w, json!({"phase": "Inqueue"}));
    pg["spec"].as_object_mut().unwrap().remove("subGroupPolicy");
    let cached = served_all().with(BackendKind::Volcano, pg);
    let again = plan_of(&j, &cached, &with_webhook());
    assert!(again.write().is_some(), "not known yet: sent once more");
    let p = plan_dropping(&j, &cached, &[(BackendKind::Volcano, "subGroupPolicy")]);
    assert!(p.write().is_none(), "{:?}", p.write());
    let warning = p
        .events
        .iter()
        .find(|(r, _)| *r == Reason::GangSpecWarning)
        .map(|(_, m)| m.clone())
        .expect("a warning");
    assert!(warning.contains("drop spec.subGroupPolicy"), "{warning}");

    // The native PodGroup without the gate: the drop is said once, as a drop.
    let j = topology_job("kubernetes", 4, json!({REQUIRED: RACK}), json!({}));
    let w = plan_of(&j, &served_all(), &with_webhook())
        .write()
        .cloned()
        .unwrap();
    let mut pg = stored(&w, json!({}));
    pg["spec"]
        .as_object_mut()
        .unwrap()
        .remove("schedulingConstraints");
    let cached = served_all().with(BackendKind::Kubernetes, pg);
    let p = plan_dropping(
        &j,
        &cached,
        &[(BackendKind::Kubernetes, "schedulingConstraints")],
    );
    assert!(p.write().is_none(), "{:?}", p.write());
    let warnings: Vec<&String> = p
        .events
        .iter()
        .filter(|(r, _)| *r == Reason::GangSpecWarning)
        .map(|(_, m)| m)
        .collect();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].contains("drop spec.schedulingConstraints")
            && !warnings[0].contains("cannot change"),
        "{warnings:?}"
    );
}

#[test]
fn rule_13_an_unschedulable_gang_held_to_a_domain_is_told_so_beside_the_schedulers_reason() {
    let j = topology_job("volcano", 12, json!({REQUIRED: RACK}), json!({}));
    let w = plan_of(&j, &served_all(), &with_webhook())
        .write()
        .cloned()
        .unwrap();
    let pg = stored(
        &w,
        json!({"phase": "Pending", "conditions": [{"type": "Unschedulable", "status": "True",
            "reason": "NotEnoughResources", "message": "12/12 tasks in gang unschedulable"}]}),
    );
    let p = plan_of(
        &j,
        &served_all().with(BackendKind::Volcano, pg),
        &with_webhook(),
    );
    let (_, note) = p
        .events
        .iter()
        .find(|(r, _)| *r == Reason::GangUnschedulable)
        .expect("GangUnschedulable");
    assert!(
        note.contains(
            "NotEnoughResources: 12/12 tasks in gang unschedulable; its PodGroup holds \
             the gang to all its pods in one domain of topology.example.com/rack"
        ),
        "{note}"
    );
    // Slices name their sub-group; a gang without a topology hears only the scheduler.
    let sliced = unschedulable_note(&topology_job("volcano", 16, json!({}), slices_of_8()));
    assert!(
        sliced.contains("each sub-group worker of 8 pods in one domain of"),
        "{sliced}"
    );
    let plain = unschedulable_note(&topology_job("volcano", 4, json!({}), json!({})));
    assert!(!plain.contains("holds the gang"), "{plain}");
}

/// The GangUnschedulable note of job `j` once Volcano says its PodGroup is unschedulable.
fn unschedulable_note(j: &Value) -> String {
    let w = plan_of(j, &served_all(), &with_webhook())
        .write()
        .cloned()
        .unwrap();
    let pg = stored(
        &w,
        json!({"conditions": [{"type": "Unschedulable", "status": "True", "message": "m"}]}),
    );
    let p = plan_of(
        j,
        &served_all().with(BackendKind::Volcano, pg),
        &with_webhook(),
    );
    p.events
        .into_iter()
        .find(|(r, _)| *r == Reason::GangUnschedulable)
        .expect("GangUnschedulable")
        .1
}

#[test]
fn rule_13_volcanos_own_rewrite_of_tier_names_into_numbers_is_accepted_not_undone() {
    let j = topology_job("volcano", 16, json!({REQUIRED: BLOCK}), slices_of_8());
    let w = plan_of(&j, &served_all(), &with_webhook())
        .write()
        .cloned()
        .unwrap();
    assert_eq!(
        w.body["metadata"]["annotations"]["podgroup-sync.io/tier-names"],
        format!("networkTopology={BLOCK},worker={RACK}")
    );
    // What Volcano's scheduler writes back: the names resolved into tier numbers.
    let mut pg = stored(
        &w,
        json!({"phase": "Pending", "conditions": [{"type": "Unschedulable", "status": "True",
            "reason": "NotEnoughResources", "message": "16/16 tasks in gang unschedulable"}]}),
    );
    pg["spec"]["networkTopology"] = json!({"mode": "hard", "highestTierAllowed": 2});
    pg["spec"]["subGroupPolicy"][0]["networkTopology"] =
        json!({"mode": "hard", "highestTierAllowed": 1});
    let cached = served_all().with(BackendKind::Volcano, pg.clone());
    let p = plan_of(&j, &cached, &with_webhook());
    assert!(
        p.write().is_none(),
        "the rewrite says the same: {:?}",
        p.write()
    );
    let note = &p
        .events
        .iter()
        .find(|(r, _)| *r == Reason::GangUnschedulable)
        .expect("GangUnschedulable")
        .1;
    assert!(
        note.contains(&format!(
            "all its pods in one domain of {BLOCK}, each sub-group worker of 8 pods in one domain \
             of {RACK}"
        )),
        "the names asked for, not the numbers: {note}"
    );
    // The job asks for another domain now: the stored numbers were resolved from other names.
    let other = topology_job("volcano", 16, json!({REQUIRED: RACK}), slices_of_8());
    let w = plan_of(&other, &cached, &with_webhook()).write().cloned();
    let w = w.expect("an update");
    assert_eq!(
        w.body["spec"]["networkTopology"],
        json!({"mode": "hard", "highestTierName": RACK})
    );
    // A rewrite that changed more than the names (the mode) is undone.
    pg["spec"]["networkTopology"] = json!({"mode": "soft", "highestTierAllowed": 2});
    let cached = served_all().with(BackendKind::Volcano, pg);
    assert!(plan_of(&j, &cached, &with_webhook()).write().is_some());
}

#[test]
fn rule_13_volcano_tiers_the_hyper_nodes_name_are_written_as_numbers() {
    let j = topology_job("volcano", 16, json!({REQUIRED: BLOCK}), slices_of_8());
    let tiers = std::sync::Arc::new(crate::topology::TierNumbers::from([
        (RACK.to_string(), 1),
        (BLOCK.to_string(), 2),
    ]));
    let p = plan_full(&j, &served_all(), &[], &tiers);
    let w = p.write().expect("a create");
    assert_eq!(
        w.body["spec"]["networkTopology"],
        json!({"mode": "hard", "highestTierAllowed": 2})
    );
    assert_eq!(
        w.body["spec"]["subGroupPolicy"][0]["networkTopology"],
        json!({"mode": "hard", "highestTierAllowed": 1}),
        "Volcano 1.14 drops a sub-group's tier given by name (volcano-sh/volcano#5189)"
    );
    assert_eq!(
        w.body["metadata"]["annotations"]["podgroup-sync.io/tier-names"],
        format!("networkTopology={BLOCK},worker={RACK}"),
        "the names asked for are still recorded"
    );

    // Written by name before the tiers were known, then resolved by Volcano's scheduler: the
    // same request, nothing to write.
    let by_name = plan_full(&j, &served_all(), &[], &Default::default())
        .write()
        .cloned()
        .unwrap();
    let mut pg = stored(&by_name, json!({"phase": "Pending"}));
    let unresolved = served_all().with(BackendKind::Volcano, pg.clone());
    pg["spec"]["networkTopology"] = json!({"mode": "hard", "highestTierAllowed": 2});
    pg["spec"]["subGroupPolicy"][0]["networkTopology"] =
        json!({"mode": "hard", "highestTierAllowed": 1});
    let resolved = served_all().with(BackendKind::Volcano, pg);
    let p = plan_full(&j, &resolved, &[], &tiers);
    assert!(p.write().is_none(), "{:?}", p.write());
    // Still by name (the scheduler has not placed it yet): the numbers are written.
    let p = plan_full(&j, &unresolved, &[], &tiers);
    let w = p.write().expect("an update");
    assert_eq!(
        w.body["spec"]["subGroupPolicy"][0]["networkTopology"]["highestTierAllowed"],
        1
    );

    // A tier the HyperNodes do not name stays a name.
    let only_rack =
        std::sync::Arc::new(crate::topology::TierNumbers::from([(RACK.to_string(), 1)]));
    let w = plan_full(&j, &served_all(), &[], &only_rack)
        .write()
        .cloned()
        .unwrap();
    assert_eq!(
        w.body["spec"]["networkTopology"],
        json!({"mode": "hard", "highestTierName": BLOCK})
    );
    assert_eq!(
        w.body["spec"]["subGroupPolicy"][0]["networkTopology"],
        json!({"mode": "hard", "highestTierAllowed": 1})
    );
}

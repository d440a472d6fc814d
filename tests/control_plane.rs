//! Proves the test control plane works: the CRDs the controller needs are installed and
//! Established, and kube-controller-manager's garbage collector collects dependents.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::Api;
use kube::api::{DeleteParams, ListParams, ObjectMeta, PostParams};

#[tokio::test]
async fn crds_are_established() {
    let cluster = support::cluster().await;
    let client = cluster.client().await;

    let ns = support::test_namespace(
        &client,
        "cp-crds",
        &[("podgroup-sync.test/purpose", "crds")],
    )
    .await;
    let got = Api::<Namespace>::all(client.clone())
        .get(&ns)
        .await
        .expect("get namespace");
    assert_eq!(
        got.metadata
            .annotations
            .unwrap_or_default()
            .get("podgroup-sync.test/purpose")
            .map(String::as_str),
        Some("crds")
    );

    let crds: BTreeMap<String, CustomResourceDefinition> =
        Api::<CustomResourceDefinition>::all(client.clone())
            .list(&ListParams::default())
            .await
            .expect("list CRDs")
            .items
            .into_iter()
            .map(|crd| (crd.metadata.name.clone().unwrap_or_default(), crd))
            .collect();

    for (name, version) in [
        ("pytorchjobs.kubeflow.org", "v1"),
        ("tfjobs.kubeflow.org", "v1"),
        ("mpijobs.kubeflow.org", "v2beta1"),
        ("podgroups.scheduling.x-k8s.io", "v1alpha1"),
        ("podgroups.scheduling.volcano.sh", "v1beta1"),
        ("queues.scheduling.volcano.sh", "v1beta1"),
    ] {
        let crd = crds
            .get(name)
            .unwrap_or_else(|| panic!("CRD {name} is not installed; have {:?}", crds.keys()));
        let established = crd
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| {
                cs.iter()
                    .any(|c| c.type_ == "Established" && c.status == "True")
            });
        assert!(
            established,
            "CRD {name} is not Established: {:?}",
            crd.status
        );
        assert!(
            crd.spec
                .versions
                .iter()
                .any(|v| v.name == version && v.served),
            "CRD {name} does not serve {version}: {:?}",
            crd.spec
                .versions
                .iter()
                .map(|v| (&v.name, v.served))
                .collect::<Vec<_>>()
        );
    }
    // mpi-operator's MPIJob (v2beta1), not the training-operator's v1 one of the same name.
    let mpi_served: Vec<&str> = crds["mpijobs.kubeflow.org"]
        .spec
        .versions
        .iter()
        .filter(|v| v.served)
        .map(|v| v.name.as_str())
        .collect();
    assert_eq!(mpi_served, ["v2beta1"]);

    // The kubectl helper works too.
    let out = cluster.kubectl_ok(&[
        "get",
        "crd",
        "mpijobs.kubeflow.org",
        "-o",
        "jsonpath={.spec.group}",
    ]);
    assert_eq!(out, "kubeflow.org");

    Api::<Namespace>::all(client)
        .delete(&ns, &DeleteParams::default())
        .await
        .expect("delete namespace");
}

#[tokio::test]
async fn garbage_collector_deletes_dependents() {
    let cluster = support::cluster().await;
    let client = cluster.client().await;
    let ns = support::test_namespace(&client, "cp-gc", &[]).await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);

    let owner = cms
        .create(
            &PostParams::default(),
            &ConfigMap {
                metadata: ObjectMeta {
                    name: Some("owner".into()),
                    ..ObjectMeta::default()
                },
                ..ConfigMap::default()
            },
        )
        .await
        .expect("create owner");
    let dependent = ConfigMap {
        metadata: ObjectMeta {
            name: Some("dependent".into()),
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".into(),
                kind: "ConfigMap".into(),
                name: "owner".into(),
                uid: owner.metadata.uid.clone().expect("owner uid"),
                block_owner_deletion: Some(true),
                controller: Some(true),
            }]),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    };
    cms.create(&PostParams::default(), &dependent)
        .await
        .expect("create dependent");

    cms.delete("owner", &DeleteParams::default())
        .await
        .expect("delete owner");
    support::wait_for(
        "the garbage collector to delete the dependent ConfigMap",
        Duration::from_secs(90),
        || {
            let cms = cms.clone();
            async move {
                cms.get_opt("dependent")
                    .await
                    .expect("get dependent")
                    .is_none()
                    .then_some(())
            }
        },
    )
    .await;

    Api::<Namespace>::all(client)
        .delete(&ns, &DeleteParams::default())
        .await
        .expect("delete namespace");
}

/// The real CRD schemas accept the three job kinds; kube-rs reads them back as written.
#[tokio::test]
async fn job_kinds_round_trip_through_the_real_crds() {
    use support::jobs::{self, Backend, Kind};
    let cluster = support::cluster().await;
    let client = cluster.client().await;
    let ns = support::test_namespace(&client, "cp-jobs", &[]).await;
    for kind in [Kind::PyTorchJob, Kind::TFJob, Kind::MPIJob] {
        let name = format!("{kind:?}").to_lowercase();
        let manifest = jobs::job(kind, Backend::SchedulerPlugins, &name, 3);
        let created = jobs::create(&client, &ns, kind, &manifest).await;
        let read = jobs::api(&client, &ns, &kind.ar())
            .get(&name)
            .await
            .expect("read back");
        assert_eq!(read.metadata.uid, created.metadata.uid);
        let workers = read.data.pointer(&kind.worker_path()).cloned();
        assert_eq!(
            workers,
            Some(serde_json::json!(3)),
            "{kind:?}: {}",
            read.data
        );
        assert_eq!(
            read.types.as_ref().unwrap().api_version,
            kind.ar().api_version
        );
    }
}

/// A PyTorchJob whose `replicas` is a string is rejected by the real CRD schema.
#[tokio::test]
async fn the_real_schema_rejects_a_malformed_job() {
    use support::jobs::{self, Backend, Kind};
    let cluster = support::cluster().await;
    let client = cluster.client().await;
    let ns = support::test_namespace(&client, "cp-reject", &[]).await;
    let mut manifest = jobs::job(Kind::PyTorchJob, Backend::SchedulerPlugins, "bad", 1);
    manifest["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] = serde_json::json!("three");
    let obj: kube::api::DynamicObject = serde_json::from_value(manifest).unwrap();
    let err = jobs::api(&client, &ns, &Kind::PyTorchJob.ar())
        .create(&PostParams::default(), &obj)
        .await
        .expect_err("the schema must reject replicas: \"three\"");
    match err {
        kube::Error::Api(status) => {
            assert_eq!(status.code, 422, "{status:?}");
            assert!(status.message.contains("replicas"), "{}", status.message);
        }
        other => panic!("unexpected error {other}"),
    }
}

/// podgroup-sync creates PodGroups with a server-side apply carrying resourceVersion "1": the
/// API server creates the object when there is none and refuses (409) when there is one, so a
/// PodGroup someone else made since the cache looked is never taken over. This pins that
/// behaviour of the real API server.
#[tokio::test]
async fn a_create_only_apply_creates_once_and_is_refused_after() {
    use kube::api::{Patch, PatchParams};
    use support::jobs::{self, Backend};
    let cluster = support::cluster().await;
    let client = cluster.client().await;
    let ns = support::test_namespace(&client, "cp-create-only", &[]).await;
    let api = jobs::api(&client, &ns, &Backend::SchedulerPlugins.ar());
    let body = serde_json::json!({
        "apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
        "metadata": {"name": "once", "resourceVersion": "1"}, "spec": {"minMember": 2}
    });
    let pp = PatchParams::apply("podgroup-sync").force();
    let created = api
        .patch("once", &pp, &Patch::Apply(&body))
        .await
        .expect("created");
    assert_eq!(created.data["spec"]["minMember"], 2);
    let mut again = body.clone();
    again["spec"]["minMember"] = serde_json::json!(5);
    match api.patch("once", &pp, &Patch::Apply(&again)).await {
        Err(kube::Error::Api(e)) => assert_eq!(e.code, 409, "{e:?}"),
        other => panic!("a create-only apply onto an existing object must be refused: {other:?}"),
    }
    let now = api.get("once").await.expect("get");
    assert_eq!(now.data["spec"]["minMember"], 2);
}

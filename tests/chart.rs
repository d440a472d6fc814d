//! The Helm chart, `chart/podgroup-sync` (SPEC §6): it lints and renders for the supported value
//! sets, its schema rejects bad values, and once installed its RBAC is enough for the controller
//! and no more. The controller runs as the chart's ServiceAccount (a TokenRequest token), and
//! each rule removed in turn makes it name the missing permission instead of crashing or
//! hanging silently.
//!
//! helm is built from its Go module by `tests/cluster/get-helm.sh` on first use.

mod support;

use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule, Role};
use kube::api::PostParams;
use kube::{Api, Client};
use serde_json::{Value, json};
use support::Cluster;
use support::chart::{Release, chart_dir, helm_stderr, install, install_with, run_helm};
use support::controller::{self, Controller};
use support::jobs::{self, Backend, Kind};
use support::lifecycle::Gang;

// ----------------------------------------------------------------------------------------------
// helm and the chart
// ----------------------------------------------------------------------------------------------

/// Writes a values file for `name` and returns its path.
fn values_file(name: &str, yaml: &str) -> PathBuf {
    let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("chart-values-{name}.yaml"));
    std::fs::write(&path, yaml).expect("write values file");
    path
}

const RELEASE: &str = "pgs";
const NAMESPACE: &str = "ops";

/// The objects `helm template` renders for `values` (the `helm test` hooks left out), or
/// helm's error.
fn template(name: &str, values: &str) -> Result<Rendered, String> {
    template_with(name, values, &["--skip-tests"])
}

fn template_with(name: &str, values: &str, extra: &[&str]) -> Result<Rendered, String> {
    let file = values_file(name, values);
    let chart = chart_dir();
    let mut args = vec![
        OsStr::new("template"),
        OsStr::new(RELEASE),
        chart.as_os_str(),
        OsStr::new("--namespace"),
        OsStr::new(NAMESPACE),
        OsStr::new("--values"),
        file.as_os_str(),
    ];
    args.extend(extra.iter().map(OsStr::new));
    let out = run_helm(&args);
    if !out.status.success() {
        return Err(helm_stderr(&out));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let docs = serde_yaml_ng::Deserializer::from_str(&text)
        .map(|doc| serde::Deserialize::deserialize(doc).expect("helm template emits YAML"))
        .filter(|v: &Value| !v.is_null())
        .collect();
    Ok(Rendered(docs))
}

fn lint(name: &str, values: &str) -> Result<(), String> {
    let file = values_file(&format!("lint-{name}"), values);
    let out = run_helm(&[
        OsStr::new("lint"),
        OsStr::new("--strict"),
        chart_dir().as_os_str(),
        OsStr::new("--values"),
        file.as_os_str(),
    ]);
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            helm_stderr(&out)
        ))
    }
}

struct Rendered(Vec<Value>);

impl Rendered {
    fn kinds(&self) -> BTreeSet<String> {
        self.0
            .iter()
            .map(|d| d["kind"].as_str().unwrap_or_default().to_string())
            .collect()
    }

    fn one(&self, kind: &str) -> &Value {
        let all: Vec<&Value> = self.0.iter().filter(|d| d["kind"] == kind).collect();
        assert_eq!(
            all.len(),
            1,
            "exactly one {kind} expected, got {}",
            all.len()
        );
        all[0]
    }

    /// The one object of `kind` whose name ends with `suffix`.
    fn named(&self, kind: &str, suffix: &str) -> &Value {
        let all: Vec<&Value> = self
            .0
            .iter()
            .filter(|d| {
                d["kind"] == kind
                    && d["metadata"]["name"]
                        .as_str()
                        .is_some_and(|n| n.ends_with(suffix))
            })
            .collect();
        assert_eq!(all.len(), 1, "exactly one {kind} *{suffix} expected");
        all[0]
    }

    fn has(&self, kind: &str) -> bool {
        self.0.iter().any(|d| d["kind"] == kind)
    }

    fn pod(&self) -> &Value {
        &self.one("Deployment")["spec"]["template"]["spec"]
    }

    fn container(&self) -> &Value {
        &self.pod()["containers"][0]
    }

    fn args(&self) -> Vec<String> {
        self.container()["args"]
            .as_array()
            .expect("container args")
            .iter()
            .map(|a| a.as_str().expect("string arg").to_string())
            .collect()
    }

    fn has_arg(&self, arg: &str) -> bool {
        self.args().iter().any(|a| a == arg)
    }
}

/// Every `--flag` of `podgroup-sync run --help`.
fn controller_flags() -> BTreeSet<String> {
    let out = Command::new(env!("CARGO_BIN_EXE_podgroup-sync"))
        .args(["run", "--help"])
        .output()
        .expect("podgroup-sync run --help");
    assert!(out.status.success(), "podgroup-sync run --help failed");
    String::from_utf8_lossy(&out.stdout)
        .split(|c: char| c.is_whitespace() || c == ',' || c == '[' || c == '<' || c == '=')
        .filter(|w| w.starts_with("--") && w.len() > 2)
        .map(str::to_string)
        .collect()
}

/// (API group, resource, verb) triples of a set of rules.
fn triples(rules: &[PolicyRule]) -> BTreeSet<(String, String, String)> {
    let mut out = BTreeSet::new();
    for r in rules {
        for g in r.api_groups.iter().flatten() {
            for res in r.resources.iter().flatten() {
                for v in &r.verbs {
                    out.insert((g.clone(), res.clone(), v.clone()));
                }
            }
        }
    }
    out
}

fn rules_of(doc: &Value) -> Vec<PolicyRule> {
    serde_json::from_value(doc["rules"].clone()).expect("RBAC rules")
}

/// The ClusterRole's permissions, exactly (SPEC §6; README "Permissions"); `webhook`: with the
/// pod-link webhook on.
fn expected_cluster_triples(
    webhook: bool,
    feasibility: bool,
    batch_jobs: bool,
) -> BTreeSet<(String, String, String)> {
    let mut want = BTreeSet::new();
    let mut add = |group: &str, resources: &[&str], verbs: &[&str]| {
        for r in resources {
            for v in verbs {
                want.insert((group.to_string(), r.to_string(), v.to_string()));
            }
        }
    };
    // Every kind podgroup-sync knows, from its own table (batch/v1 Jobs with --batch-jobs).
    for k in podgroup_sync::job::KINDS {
        if batch_jobs || k.group != "batch" {
            add(k.group, &[k.plural], &["get", "list", "watch"]);
        }
    }
    add("", &["namespaces", "limitranges"], &["list", "watch"]);
    add(
        "scheduling.k8s.io",
        &["priorityclasses"],
        &["list", "watch"],
    );
    add("node.k8s.io", &["runtimeclasses"], &["list", "watch"]);
    // Kueue's Workloads (SPEC §12), watched while their CRD is served.
    add("kueue.x-k8s.io", &["workloads"], &["list", "watch"]);
    // Volcano's HyperNodes (SPEC §13): tier numbers by name.
    add("topology.volcano.sh", &["hypernodes"], &["list", "watch"]);
    add(
        "admissionregistration.k8s.io",
        &[
            "validatingadmissionpolicies",
            "validatingadmissionpolicybindings",
        ],
        &["list", "watch"],
    );
    let pg_verbs = ["list", "watch", "create", "patch", "delete"];
    add("scheduling.x-k8s.io", &["podgroups"], &pg_verbs);
    add("scheduling.volcano.sh", &["podgroups"], &pg_verbs);
    add("scheduling.k8s.io", &["podgroups"], &pg_verbs);
    add("events.k8s.io", &["events"], &["list", "create", "patch"]);
    if webhook {
        add("", &["pods"], &["list", "watch"]);
    }
    if feasibility {
        add("", &["nodes"], &["list", "watch"]);
        add("scheduling.volcano.sh", &["queues"], &["list", "watch"]);
    }
    want
}

/// What every rendering must satisfy, whatever the values.
fn check_invariants(name: &str, r: &Rendered, flags: &BTreeSet<String>) {
    let pod = r.pod();
    let c = r.container();
    // Restricted Pod Security.
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true, "{name}");
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"], "RuntimeDefault",
        "{name}"
    );
    assert_eq!(
        c["securityContext"]["allowPrivilegeEscalation"], false,
        "{name}"
    );
    assert_eq!(
        c["securityContext"]["readOnlyRootFilesystem"], true,
        "{name}"
    );
    assert_eq!(
        c["securityContext"]["capabilities"]["drop"],
        json!(["ALL"]),
        "{name}"
    );
    // The downward API feeds the Lease identity and namespace.
    let env = c["env"].as_array().expect("env");
    for (var, field) in [
        ("POD_NAME", "metadata.name"),
        ("POD_NAMESPACE", "metadata.namespace"),
    ] {
        assert!(
            env.iter()
                .any(|e| e["name"] == var && e["valueFrom"]["fieldRef"]["fieldPath"] == field),
            "{name}: {var} from {field}"
        );
    }
    assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz", "{name}");
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz", "{name}");
    // Every value lands on a flag the binary has.
    let args = r.args();
    assert_eq!(args.first().map(String::as_str), Some("run"), "{name}");
    for arg in &args[1..] {
        let flag = arg.split('=').next().unwrap_or_default();
        assert!(
            flags.contains(flag),
            "{name}: the chart passes {arg}, but `podgroup-sync run --help` has no {flag}"
        );
    }
    let port = c["ports"][0]["containerPort"].as_u64().expect("port");
    assert!(
        args.iter()
            .any(|a| a.starts_with("--http-addr=") && a.ends_with(&format!(":{port}"))),
        "{name}: --http-addr matches the container port"
    );
    // Least privilege: exactly the rules of SPEC §6, nothing on secrets, no write on pods (only
    // the webhook's metadata watch reads them).
    if r.has("ClusterRole") {
        let got = triples(&rules_of(r.one("ClusterRole")));
        let mut want = expected_cluster_triples(
            r.has("MutatingWebhookConfiguration"),
            r.has_arg("--gang-feasibility"),
            r.has_arg("--batch-jobs"),
        );
        // A certificate the controller manages: its own configuration's caBundle.
        if r.args()
            .iter()
            .any(|a| a.starts_with("--webhook-cert-secret="))
        {
            for v in ["get", "update"] {
                want.insert((
                    "admissionregistration.k8s.io".into(),
                    "mutatingwebhookconfigurations".into(),
                    v.into(),
                ));
            }
        }
        assert_eq!(got, want, "{name}: ClusterRole rules");
        assert!(!got.iter().any(|(_, res, v)| {
            ["secrets", "configmaps", "*"].contains(&res.as_str())
                || (res == "pods" && !["list", "watch"].contains(&v.as_str()))
                || v == "*"
        }));
    }
    if r.has("Role") {
        let role = r.named("Role", "-leader-election");
        assert_eq!(role["metadata"]["namespace"], NAMESPACE, "{name}");
        let rules = rules_of(role);
        assert_eq!(
            triples(&rules),
            [
                ("coordination.k8s.io", "leases", "create"),
                ("coordination.k8s.io", "leases", "get"),
                ("coordination.k8s.io", "leases", "update"),
            ]
            .iter()
            .map(|(g, r, v)| (g.to_string(), r.to_string(), v.to_string()))
            .collect(),
            "{name}: Role rules"
        );
        let lease = args
            .iter()
            .find_map(|a| a.strip_prefix("--leader-elect-lease-name="))
            .expect("a Role means leader election is on");
        for rule in rules
            .iter()
            .filter(|r| r.verbs.iter().any(|v| v != "create"))
        {
            assert_eq!(
                rule.resource_names,
                Some(vec![lease.to_string()]),
                "{name}: get/update only on the Lease"
            );
        }
    }
}

// ----------------------------------------------------------------------------------------------
// (a) lint and template
// ----------------------------------------------------------------------------------------------

const DEFAULTS: &str = "";

const VOLCANO_DRY_RUN_HA: &str = r#"
controller:
  defaultBackend: volcano
  defaultMode: dry-run
  resize: while-suspended
  gangBrokenSeconds: 120
  auditIntervalSeconds: 0
  gangFeasibility: true
  batchJobs: true
replicas: 2
leaderElection:
  leaseName: pgs-leader
  leaseDurationSeconds: 20
  renewDeadlineSeconds: 12
podDisruptionBudget:
  minAvailable: 1
"#;

const MONITORING: &str = r#"
serviceMonitor:
  enabled: true
  labels:
    release: prom
  scrapeTimeout: 10s
podMonitor:
  enabled: true
  interval: 1m
prometheusRule:
  enabled: true
  labels:
    release: prom
grafanaDashboard:
  enabled: true
  namespace: monitoring
  annotations:
    grafana_folder: Kubeflow
"#;

const LOCKED_DOWN: &str = r#"
controller:
  annotationKey: gang.example.com/managed
  keepFinished: true
  defaultScheduleTimeoutSeconds: 90
  concurrency: 4
schedulers:
  coscheduling: [gang-scheduler]
  volcano: vc-scheduler
logging:
  format: text
  level: info,podgroup_sync=debug
networkPolicy:
  enabled: true
  metricsFrom:
    - namespaceSelector:
        matchLabels:
          kubernetes.io/metadata.name: monitoring
  apiServer:
    cidrs: [10.0.0.1/32]
  allowDNS: true
resources:
  requests: {cpu: 50m, memory: 64Mi}
  limits: {cpu: "1", memory: 256Mi}
nodeSelector:
  node-role.kubernetes.io/control-plane: ""
tolerations:
  - {key: node-role.kubernetes.io/control-plane, operator: Exists, effect: NoSchedule}
topologySpreadConstraints:
  - {maxSkew: 1, topologyKey: kubernetes.io/hostname, whenUnsatisfiable: DoNotSchedule}
priorityClassName: system-cluster-critical
image:
  repository: registry.example.com/podgroup-sync
  tag: "0.1.0"
  digest: sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef
http:
  port: 9090
"#;

const BRING_YOUR_OWN_RBAC: &str = r#"
controller:
  defaultMode: true # a YAML boolean, as --set controller.defaultMode=true gives
serviceAccount:
  create: false
  name: platform-controllers
rbac:
  create: false
service:
  enabled: false
podDisruptionBudget:
  enabled: false
leaderElection:
  enabled: false
webhook:
  enabled: false
"#;

const WEBHOOK_CERT_MANAGER: &str = r#"
webhook:
  port: 10250
  timeoutSeconds: 3
  ownerWaitMilliseconds: 1500
  reinvocationPolicy: Never
  coschedulingSchedulerName: ""
  namespaceSelector:
    matchLabels:
      gang-scheduling: "on"
  certificate:
    certManager:
      enabled: true
      issuerRef: {name: cluster-ca, kind: ClusterIssuer}
"#;

#[test]
fn lint_and_template_pass_for_every_supported_value_set() {
    let flags = controller_flags();
    let sets = [
        ("defaults", DEFAULTS),
        ("volcano-dry-run-ha", VOLCANO_DRY_RUN_HA),
        ("monitoring", MONITORING),
        ("locked-down", LOCKED_DOWN),
        ("bring-your-own-rbac", BRING_YOUR_OWN_RBAC),
        ("webhook-cert-manager", WEBHOOK_CERT_MANAGER),
        ("webhook-cert-manager-own-ca", WEBHOOK_CERT_MANAGER_OWN_CA),
        (
            "webhook-controller-certificate",
            WEBHOOK_CONTROLLER_CERTIFICATE,
        ),
    ];
    for (name, values) in sets {
        lint(name, values).unwrap_or_else(|e| panic!("helm lint --strict, {name}:\n{e}"));
        let r = template(name, values).unwrap_or_else(|e| panic!("helm template, {name}:\n{e}"));
        check_invariants(name, &r, &flags);

        match name {
            "defaults" => {
                let kinds: BTreeSet<String> = [
                    "ClusterRole",
                    "ClusterRoleBinding",
                    "Deployment",
                    "MutatingWebhookConfiguration",
                    "PodDisruptionBudget",
                    "Role",
                    "RoleBinding",
                    "Secret",
                    "Service",
                    "ServiceAccount",
                ]
                .map(String::from)
                .into();
                assert_eq!(r.kinds(), kinds);
                assert_eq!(r.one("Deployment")["spec"]["replicas"], 1);
                for arg in [
                    "--default-backend=scheduler-plugins",
                    "--annotation-key=podgroup-sync.io/enabled",
                    "--default-mode=off",
                    "--resize=always",
                    "--log-format=json",
                    "--leader-elect",
                    "--leader-elect-namespace=ops",
                    "--leader-elect-lease-name=pgs-podgroup-sync",
                    "--http-addr=0.0.0.0:8080",
                ] {
                    assert!(r.has_arg(arg), "defaults: {arg} in {:?}", r.args());
                }
                assert!(!r.has_arg("--keep-finished"));
                assert!(
                    !r.args()
                        .iter()
                        .any(|a| a.starts_with("--default-schedule-timeout-seconds"))
                );
                // The ServiceAccount does not hand out tokens; only the controller pod mounts one.
                assert_eq!(
                    r.one("ServiceAccount")["automountServiceAccountToken"],
                    false
                );
                assert_eq!(r.pod()["automountServiceAccountToken"], true);
                assert_eq!(
                    r.one("ClusterRoleBinding")["subjects"][0],
                    json!({"kind": "ServiceAccount", "name": "pgs-podgroup-sync", "namespace": "ops"})
                );
                let svc = r.named("Service", "-metrics");
                assert_eq!(svc["spec"]["ports"][0]["targetPort"], "http");
                check_generated_webhook(&r);
            }
            "webhook-cert-manager" => check_cert_manager_webhook(&r),
            "webhook-cert-manager-own-ca" => check_cert_manager_own_ca(&r),
            "webhook-controller-certificate" => check_controller_certificate(&r, values),
            "volcano-dry-run-ha" => {
                assert_eq!(r.one("Deployment")["spec"]["replicas"], 2);
                for arg in [
                    "--default-backend=volcano",
                    "--default-mode=dry-run",
                    "--resize=while-suspended",
                    "--leader-elect",
                    "--leader-elect-lease-name=pgs-leader",
                    "--leader-elect-lease-duration-seconds=20",
                    "--leader-elect-renew-deadline-seconds=12",
                    "--leader-elect-retry-period-seconds=2",
                    "--gang-broken-seconds=120",
                    "--audit-interval-seconds=0",
                    "--gang-feasibility",
                ] {
                    assert!(r.has_arg(arg), "{name}: {arg} in {:?}", r.args());
                }
                let pdb = &r.one("PodDisruptionBudget")["spec"];
                assert_eq!(pdb["minAvailable"], 1);
                assert!(pdb.get("maxUnavailable").is_none());
            }
            "monitoring" => {
                for kind in [
                    "ServiceMonitor",
                    "PodMonitor",
                    "PrometheusRule",
                    "ConfigMap",
                ] {
                    assert!(r.has(kind), "{name}: {kind}");
                }
                let sm = r.one("ServiceMonitor");
                assert_eq!(sm["metadata"]["labels"]["release"], "prom");
                assert_eq!(sm["spec"]["endpoints"][0]["port"], "http");
                assert_eq!(sm["spec"]["endpoints"][0]["scrapeTimeout"], "10s");
                // The ServiceMonitor selects the metrics Service by its labels.
                let svc_labels = &r.named("Service", "-metrics")["metadata"]["labels"];
                for (k, v) in sm["spec"]["selector"]["matchLabels"].as_object().unwrap() {
                    assert_eq!(&svc_labels[k], v, "{name}: Service label {k}");
                }
                assert_eq!(
                    r.one("PodMonitor")["spec"]["podMetricsEndpoints"][0]["interval"],
                    "1m"
                );
                // One source: the rules are dashboards/alerts.yaml's groups, as they are.
                let alerts: Value = serde_yaml_ng::from_str(
                    &std::fs::read_to_string(
                        Path::new(env!("CARGO_MANIFEST_DIR")).join("dashboards/alerts.yaml"),
                    )
                    .expect("dashboards/alerts.yaml"),
                )
                .expect("alerts.yaml is YAML");
                let rule = r.one("PrometheusRule");
                assert_eq!(rule["spec"]["groups"], alerts["groups"]);
                assert_eq!(rule["metadata"]["labels"]["release"], "prom");
                // The dashboard ConfigMap carries dashboards/podgroup-sync.json byte for byte.
                let dashboard = std::fs::read_to_string(
                    Path::new(env!("CARGO_MANIFEST_DIR")).join("dashboards/podgroup-sync.json"),
                )
                .expect("dashboards/podgroup-sync.json");
                let cm = r.one("ConfigMap");
                assert_eq!(cm["metadata"]["namespace"], "monitoring");
                assert_eq!(cm["metadata"]["labels"]["grafana_dashboard"], "1");
                assert_eq!(cm["metadata"]["annotations"]["grafana_folder"], "Kubeflow");
                assert_eq!(
                    cm["data"]["podgroup-sync.json"].as_str(),
                    Some(dashboard.trim_end_matches('\n'))
                );
                // The alert rules find the targets by a job label containing "podgroup-sync":
                // the Service (ServiceMonitor) and the PodMonitor names provide it.
                assert!(
                    r.named("Service", "-metrics")["metadata"]["name"]
                        .as_str()
                        .unwrap()
                        .contains("podgroup-sync")
                );
            }
            "locked-down" => {
                for arg in [
                    "--annotation-key=gang.example.com/managed",
                    "--keep-finished",
                    "--default-schedule-timeout-seconds=90",
                    "--concurrency=4",
                    "--coscheduling-scheduler-names=gang-scheduler",
                    "--volcano-scheduler-name=vc-scheduler",
                    "--log-format=text",
                    "--http-addr=0.0.0.0:9090",
                ] {
                    assert!(r.has_arg(arg), "{name}: {arg} in {:?}", r.args());
                }
                let c = r.container();
                assert_eq!(
                    c["image"],
                    "registry.example.com/podgroup-sync:0.1.0@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
                );
                assert_eq!(c["resources"]["limits"]["memory"], "256Mi");
                assert!(
                    c["env"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .any(|e| e["name"] == "PODGROUP_SYNC_LOG"
                            && e["value"] == "info,podgroup_sync=debug")
                );
                let pod = r.pod();
                assert_eq!(
                    pod["nodeSelector"]["node-role.kubernetes.io/control-plane"],
                    ""
                );
                assert_eq!(pod["tolerations"][0]["operator"], "Exists");
                assert_eq!(pod["priorityClassName"], "system-cluster-critical");
                // The chart fills the spread constraint's selector with the pods' own labels.
                assert_eq!(
                    pod["topologySpreadConstraints"][0]["labelSelector"]["matchLabels"]["app.kubernetes.io/instance"],
                    RELEASE
                );
                let np = &r.one("NetworkPolicy")["spec"];
                assert_eq!(np["ingress"][0]["ports"][0]["port"], "http");
                assert_eq!(
                    np["ingress"][0]["from"][0]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"],
                    "monitoring"
                );
                assert_eq!(np["egress"][0]["to"][0]["ipBlock"]["cidr"], "10.0.0.1/32");
                assert_eq!(np["egress"][1]["ports"][0]["port"], 53);
                // The API server reaches the webhook.
                assert_eq!(np["ingress"][1]["ports"][0]["port"], "webhook");
            }
            "bring-your-own-rbac" => {
                let kinds: BTreeSet<String> = ["Deployment"].map(String::from).into();
                assert_eq!(r.kinds(), kinds);
                assert_eq!(r.pod()["serviceAccountName"], "platform-controllers");
                assert!(r.has_arg("--default-mode=true"), "{:?}", r.args());
                assert!(!r.args().iter().any(|a| a.starts_with("--leader-elect")));
            }
            _ => unreachable!(),
        }
    }
}

/// The webhook with the certificate the chart generates: the configuration (Ignore, None, 5 s,
/// Pod CREATE, the operators' pods only) reaches the Service, the Secret's certificate is for the
/// Service's names and signed by the CA in the caBundle, and the pod serves it from the Secret.
fn check_generated_webhook(r: &Rendered) {
    let hook = &r.one("MutatingWebhookConfiguration")["webhooks"][0];
    for (field, want) in [
        ("failurePolicy", json!("Ignore")),
        ("sideEffects", json!("None")),
        ("timeoutSeconds", json!(5)),
        ("reinvocationPolicy", json!("IfNeeded")),
        ("admissionReviewVersions", json!(["v1"])),
    ] {
        assert_eq!(hook[field], want, "{field}");
    }
    assert_eq!(
        hook["rules"],
        json!([{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"], "scope": "Namespaced"}])
    );
    assert_eq!(
        hook["objectSelector"],
        json!({"matchExpressions": [{"key": "training.kubeflow.org/job-name", "operator": "Exists"}]})
    );
    // One entry per workload operator's pod label, the same in all but name and selector.
    let hooks = r.one("MutatingWebhookConfiguration")["webhooks"]
        .as_array()
        .unwrap()
        .clone();
    let names: Vec<&str> = hooks.iter().map(|h| h["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "pod-link.podgroup-sync.io",
            "jobset.pod-link.podgroup-sync.io",
            "lws.pod-link.podgroup-sync.io",
            "ray.pod-link.podgroup-sync.io"
        ]
    );
    for (h, label) in hooks[1..].iter().zip([
        "jobset.sigs.k8s.io/jobset-name",
        "leaderworkerset.sigs.k8s.io/name",
        "ray.io/cluster",
    ]) {
        assert_eq!(
            h["objectSelector"],
            json!({"matchExpressions": [{"key": label, "operator": "Exists"}]})
        );
        for field in [
            "clientConfig",
            "rules",
            "failurePolicy",
            "timeoutSeconds",
            "sideEffects",
        ] {
            assert_eq!(h[field], hook[field], "{field}");
        }
    }
    assert_eq!(
        hook["clientConfig"]["service"],
        json!({"name": "pgs-podgroup-sync-webhook", "namespace": "ops", "path": "/pod-link", "port": 443})
    );
    let svc = r.named("Service", "-webhook");
    assert_eq!(svc["spec"]["ports"][0]["targetPort"], "webhook");
    let secret = r.one("Secret");
    assert_eq!(secret["metadata"]["name"], "pgs-podgroup-sync-webhook-tls");
    assert_eq!(hook["clientConfig"]["caBundle"], secret["data"]["ca.crt"]);
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("chart-certs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for f in ["ca.crt", "tls.crt"] {
        let pem = base64::Engine::decode(
            &base64::engine::general_purpose::STANDARD,
            secret["data"][f].as_str().unwrap(),
        )
        .unwrap();
        std::fs::write(dir.join(f), pem).unwrap();
    }
    let verify = Command::new("openssl")
        .current_dir(&dir)
        .args(["verify", "-CAfile", "ca.crt", "tls.crt"])
        .output()
        .unwrap();
    assert!(
        verify.status.success(),
        "{}",
        String::from_utf8_lossy(&verify.stderr)
    );
    let san = Command::new("openssl")
        .current_dir(&dir)
        .args(["x509", "-in", "tls.crt", "-noout", "-ext", "subjectAltName"])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&san.stdout).contains("DNS:pgs-podgroup-sync-webhook.ops.svc"),
        "{}",
        String::from_utf8_lossy(&san.stdout)
    );
    for arg in [
        "--webhook",
        "--webhook-addr=0.0.0.0:9443",
        "--webhook-cert-file=/etc/podgroup-sync/webhook/tls.crt",
        "--webhook-key-file=/etc/podgroup-sync/webhook/tls.key",
        "--link-coscheduling-scheduler-name=scheduler-plugins-scheduler",
    ] {
        assert!(r.has_arg(arg), "{arg} in {:?}", r.args());
    }
    assert_eq!(
        r.pod()["volumes"][0]["secret"]["secretName"],
        "pgs-podgroup-sync-webhook-tls"
    );
    assert_eq!(
        r.container()["ports"][1],
        json!({"name": "webhook", "containerPort": 9443, "protocol": "TCP"})
    );
}

const WEBHOOK_CONTROLLER_CERTIFICATE: &str = r#"
webhook:
  certificate:
    controller: true
"#;

/// The certificate the controller manages: an empty Secret it may get and update (by name
/// only), its configuration without a caBundle (the controller writes it, and may update only
/// that configuration), nothing mounted, and a rendering that is the same every time (no
/// generated key, no lookup), so `helm template | kubectl apply` can run again and again.
fn check_controller_certificate(r: &Rendered, values: &str) {
    let secret = r.one("Secret");
    assert_eq!(secret["type"], "Opaque");
    assert!(secret.get("data").is_none(), "{secret}");
    let mwc = r.one("MutatingWebhookConfiguration");
    assert!(mwc["webhooks"][0]["clientConfig"].get("caBundle").is_none());
    let role = r.named("Role", "-webhook-certificate");
    assert_eq!(
        rules_of(role),
        vec![
            serde_json::from_value::<PolicyRule>(json!({"apiGroups": [""],
            "resources": ["secrets"], "resourceNames": ["pgs-podgroup-sync-webhook-tls"],
            "verbs": ["get", "update"]}))
            .unwrap()
        ]
    );
    let cluster_rules = rules_of(r.one("ClusterRole"));
    let mwc_rule = cluster_rules
        .iter()
        .find(|r| {
            r.resources
                .iter()
                .flatten()
                .any(|x| x == "mutatingwebhookconfigurations")
        })
        .expect("a rule for the configuration");
    assert_eq!(
        mwc_rule.resource_names.as_deref(),
        Some(&["pgs-podgroup-sync".to_string()][..])
    );
    assert!(
        r.has_arg("--webhook-cert-secret=ops/pgs-podgroup-sync-webhook-tls"),
        "{:?}",
        r.args()
    );
    assert!(
        r.has_arg("--webhook-configuration=pgs-podgroup-sync"),
        "{:?}",
        r.args()
    );
    assert!(
        r.has_arg("--webhook-cert-hosts=pgs-podgroup-sync-webhook,pgs-podgroup-sync-webhook.ops,pgs-podgroup-sync-webhook.ops.svc,pgs-podgroup-sync-webhook.ops.svc.cluster.local"),
        "{:?}",
        r.args()
    );
    assert!(
        !r.args()
            .iter()
            .any(|a| a.starts_with("--webhook-cert-file"))
    );
    assert!(r.pod().get("volumes").is_none(), "nothing mounted");
    let again = template("webhook-controller-certificate", values).unwrap();
    assert_eq!(again.0, r.0, "two renderings differ");
}

const WEBHOOK_CERT_MANAGER_OWN_CA: &str = r#"
webhook:
  certificate:
    certManager:
      enabled: true
"#;

/// cert-manager without an issuer: a CA of the release's own signs the serving certificate,
/// and the caBundle is injected from that CA, which the serving certificate's renewals leave
/// unchanged.
fn check_cert_manager_own_ca(r: &Rendered) {
    assert!(!r.has("Secret"), "{:?}", r.kinds());
    let of = |kind: &str| -> Vec<&Value> { r.0.iter().filter(|d| d["kind"] == kind).collect() };
    let certs = of("Certificate");
    let ca = certs
        .iter()
        .find(|c| c["spec"]["isCA"] == true)
        .expect("a CA Certificate");
    assert_eq!(
        ca["spec"]["issuerRef"],
        json!({"name": "pgs-podgroup-sync-webhook-selfsigned", "kind": "Issuer"})
    );
    assert_eq!(ca["spec"]["duration"], "87600h");
    let serving = certs
        .iter()
        .find(|c| c["spec"]["isCA"] != true)
        .expect("a serving Certificate");
    assert_eq!(
        serving["spec"]["issuerRef"],
        json!({"name": "pgs-podgroup-sync-webhook-ca", "kind": "Issuer"})
    );
    assert_eq!(
        serving["spec"]["secretName"],
        "pgs-podgroup-sync-webhook-tls"
    );
    let issuers = of("Issuer");
    let ca_issuer = issuers
        .iter()
        .find(|i| i["metadata"]["name"] == "pgs-podgroup-sync-webhook-ca")
        .expect("the CA Issuer");
    assert_eq!(
        ca_issuer["spec"]["ca"]["secretName"],
        ca["spec"]["secretName"]
    );
    assert!(
        issuers
            .iter()
            .any(|i| i["spec"].get("selfSigned").is_some())
    );
    let mwc = r.one("MutatingWebhookConfiguration");
    assert_eq!(
        mwc["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
        "ops/pgs-podgroup-sync-webhook-ca"
    );
}

/// The webhook with cert-manager: a Certificate from the given issuer into the Secret the pod
/// mounts, the CA injected (no caBundle, no generated Secret).
fn check_cert_manager_webhook(r: &Rendered) {
    assert!(!r.has("Secret") && !r.has("Issuer"), "{:?}", r.kinds());
    let cert = r.one("Certificate");
    assert_eq!(cert["spec"]["secretName"], "pgs-podgroup-sync-webhook-tls");
    assert_eq!(
        cert["spec"]["issuerRef"],
        json!({"name": "cluster-ca", "kind": "ClusterIssuer"})
    );
    let mwc = r.one("MutatingWebhookConfiguration");
    assert_eq!(
        mwc["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
        "ops/pgs-podgroup-sync-webhook"
    );
    let hook = &mwc["webhooks"][0];
    assert!(hook["clientConfig"].get("caBundle").is_none());
    assert_eq!(hook["timeoutSeconds"], 3);
    assert_eq!(hook["reinvocationPolicy"], "Never");
    assert_eq!(
        hook["namespaceSelector"],
        json!({"matchLabels": {"gang-scheduling": "on"}})
    );
    assert!(r.has_arg("--webhook-addr=0.0.0.0:10250"), "{:?}", r.args());
    assert!(
        r.has_arg("--link-coscheduling-scheduler-name="),
        "{:?}",
        r.args()
    );
    assert!(r.has_arg("--webhook-owner-wait-ms=1500"), "{:?}", r.args());
}

/// The README's values table names every value of values.yaml (a map may be documented whole).
#[test]
fn chart_readme_lists_every_value() {
    let readme = std::fs::read_to_string(chart_dir().join("README.md")).expect("chart README");
    let values: Value = serde_yaml_ng::from_str(
        &std::fs::read_to_string(chart_dir().join("values.yaml")).expect("values.yaml"),
    )
    .expect("values.yaml is YAML");
    fn walk(prefix: &str, v: &Value, readme: &str, missing: &mut Vec<String>) {
        let documented = |p: &str| readme.contains(&format!("| `{p}` |"));
        match v {
            Value::Object(map) => {
                for (k, v) in map {
                    let path = if prefix.is_empty() {
                        k.clone()
                    } else {
                        format!("{prefix}.{k}")
                    };
                    if documented(&path) {
                        continue;
                    }
                    match v {
                        Value::Object(m) if !m.is_empty() => walk(&path, v, readme, missing),
                        _ => missing.push(path),
                    }
                }
            }
            _ => unreachable!(),
        }
    }
    let mut missing = Vec::new();
    walk("", &values, &readme, &mut missing);
    assert!(
        missing.is_empty(),
        "values missing from chart/podgroup-sync/README.md: {missing:?}"
    );
}

// ----------------------------------------------------------------------------------------------
// (b) the schema
// ----------------------------------------------------------------------------------------------

#[test]
fn schema_rejects_bad_values() {
    let cases = [
        (
            "unknown backend",
            "controller:\n  defaultBackend: kai\n",
            "/controller/defaultBackend",
        ),
        ("negative replicas", "replicas: -1\n", "/replicas"),
        (
            "unknown top-level key",
            "replica: 2\n",
            "'replica' not allowed",
        ),
        (
            "unknown nested key",
            "leaderElection:\n  leaseDuration: 15\n",
            "'leaseDuration' not allowed",
        ),
        (
            "unknown default mode",
            "controller:\n  defaultMode: enabled\n",
            "/controller/defaultMode",
        ),
        (
            "unknown resize policy",
            "controller:\n  resize: sometimes\n",
            "/controller/resize",
        ),
        (
            "unknown log format",
            "logging:\n  format: logfmt\n",
            "/logging/format",
        ),
        (
            "annotation key with a space",
            "controller:\n  annotationKey: \"podgroup sync/enabled\"\n",
            "/controller/annotationKey",
        ),
        ("port out of range", "http:\n  port: 70000\n", "/http/port"),
        (
            "zero concurrency",
            "controller:\n  concurrency: 0\n",
            "/controller/concurrency",
        ),
        (
            "replicas without leader election",
            "replicas: 2\nleaderElection:\n  enabled: false\n",
            "needs leaderElection.enabled",
        ),
        (
            "renew deadline not below the lease duration",
            "leaderElection:\n  renewDeadlineSeconds: 15\n",
            "renewDeadlineSeconds must be less",
        ),
    ];
    let mut wrong = String::new();
    for (what, values, expect) in cases {
        match template(&format!("bad-{}", what.replace(' ', "-")), values) {
            Ok(_) => writeln!(wrong, "{what}: helm template accepted it").unwrap(),
            Err(e) if !e.contains(expect) => {
                writeln!(wrong, "{what}: error does not mention {expect:?}:\n{e}").unwrap()
            }
            Err(_) => {}
        }
    }
    assert!(wrong.is_empty(), "{wrong}");
}

// ----------------------------------------------------------------------------------------------
// (c) install, then run the controller with only the chart's RBAC
// ----------------------------------------------------------------------------------------------

#[tokio::test]
async fn the_chart_installs_and_its_rbac_is_enough_for_the_lifecycle() {
    let cluster = support::cluster().await;
    let client = cluster.client().await;
    let release_ns = support::test_namespace(&client, "chart", &[]).await;
    let release = install(cluster, &release_ns);

    // No more than it needs: nothing on pods, secrets or configmaps, no writes on jobs.
    let mut too_much = Vec::new();
    for (verb, resource) in [
        ("get", "pods"),
        ("create", "pods"),
        ("patch", "pods"),
        ("delete", "pods"),
        ("get", "secrets"),
        ("list", "secrets"),
        ("list", "configmaps"),
        ("update", "pytorchjobs.kubeflow.org"),
        ("patch", "pytorchjobs.kubeflow.org"),
        ("delete", "pytorchjobs.kubeflow.org"),
        ("update", "pytorchjobs.kubeflow.org/status"),
        ("patch", "tfjobs.kubeflow.org"),
        ("patch", "mpijobs.kubeflow.org"),
        ("patch", "xgboostjobs.kubeflow.org"),
        ("patch", "paddlejobs.kubeflow.org"),
        ("patch", "jaxjobs.kubeflow.org"),
        ("patch", "namespaces"),
        ("deletecollection", "podgroups.scheduling.x-k8s.io"),
        ("update", "podgroups.scheduling.volcano.sh/status"),
        ("delete", "events.events.k8s.io"),
        ("list", "leases.coordination.k8s.io"),
    ] {
        if release.can_i(cluster, verb, resource, None) {
            too_much.push(format!("{verb} {resource}"));
        }
    }
    if release.can_i(
        cluster,
        "create",
        "leases.coordination.k8s.io",
        Some("default"),
    ) {
        too_much.push("create leases outside the release namespace".into());
    }
    assert!(
        too_much.is_empty(),
        "the chart's ServiceAccount may do more than it needs: {too_much:?}"
    );
    assert!(release.can_i(cluster, "patch", "podgroups.scheduling.x-k8s.io", None));

    let args = release.args();
    let mut ctl = controller::start(cluster, Some(&release.kubeconfig), &args);

    // Leader election (on by default) works with the Role: the controller holds the Lease.
    assert!(args.contains(&"--leader-elect"), "{args:?}");
    let lease = release.arg("--leader-elect-lease-name").expect("a Lease");
    support::wait_for("the leader Lease", jobs::WAIT, || async {
        let out = cluster.kubectl(&[
            "get",
            "lease",
            lease,
            "-n",
            &release.namespace,
            "-o",
            "jsonpath={.spec.holderIdentity}",
        ]);
        (out.status.success() && !out.stdout.is_empty()).then_some(())
    })
    .await;

    let annotation_key = release.arg("--annotation-key").expect("--annotation-key");
    let ns = support::test_namespace(&client, "chart-jobs", &[(annotation_key, "true")]).await;
    let log = |c: &Controller| c.log_tail();

    // The whole lifecycle on both backends, as the ServiceAccount.
    let ctl_log = || ctl.log_tail();
    for backend in [Backend::SchedulerPlugins, Backend::Volcano] {
        let name = match backend {
            Backend::SchedulerPlugins => "gang-sp",
            Backend::Volcano => "gang-vc",
            Backend::Kubernetes => "gang-k8s",
        };
        let gang = Gang {
            client: &client,
            ns: &ns,
            kind: Kind::PyTorchJob,
            backend,
            name,
            log: &ctl_log,
        };
        gang.whole_lifecycle().await;
    }

    // Events (events.k8s.io create) and a dry-run namespace: reported, nothing written.
    let dry = support::test_namespace(&client, "chart-dry", &[(annotation_key, "dry-run")]).await;
    let b = Backend::SchedulerPlugins;
    jobs::create(
        &client,
        &dry,
        Kind::PyTorchJob,
        &jobs::job(Kind::PyTorchJob, b, "dry", 1),
    )
    .await;
    jobs::wait_event(&client, &dry, "dry", "WouldCreatePodGroup").await;
    assert!(jobs::get_pg(&client, &dry, b, "dry").await.is_none());

    // NOTES.txt's instructions work: the annotation command, and the Events query.
    assert!(
        release.install_output.contains(&format!(
            "kubectl annotate namespace <namespace> {annotation_key}=true"
        )),
        "{}",
        release.install_output
    );
    let reported = cluster.kubectl_ok(&[
        "get",
        "events",
        "-n",
        &dry,
        "--field-selector",
        "reportingComponent=podgroup-sync",
        "-o",
        "name",
    ]);
    assert!(
        !reported.trim().is_empty(),
        "no Events by reportingComponent"
    );

    // Nothing was refused along the way.
    let text = std::fs::read_to_string(&ctl.log).unwrap_or_default();
    let forbidden: Vec<&str> = text.lines().filter(|l| l.contains("forbidden")).collect();
    assert!(
        forbidden.is_empty(),
        "the controller was refused something with the chart's RBAC:\n{}",
        forbidden.join("\n")
    );
    assert!(ctl.child.try_wait().unwrap().is_none(), "{}", log(&ctl));
    ctl.stop();
    // The webhook's certificate: the configuration trusts the Secret's CA, and `helm upgrade`
    // keeps both (a new CA on every upgrade would break the pods already running).
    let webhook_tls = |cluster: &Cluster| {
        let secret: Value = serde_json::from_str(&cluster.kubectl_ok(&[
            "get",
            "secret",
            &format!("{}-podgroup-sync-webhook-tls", release.name),
            "-n",
            &release.namespace,
            "-o",
            "json",
        ]))
        .unwrap();
        let mwc: Value = serde_json::from_str(&cluster.kubectl_ok(&[
            "get",
            "mutatingwebhookconfiguration",
            &format!("{}-podgroup-sync", release.name),
            "-o",
            "json",
        ]))
        .unwrap();
        assert_eq!(
            mwc["webhooks"][0]["clientConfig"]["caBundle"],
            secret["data"]["ca.crt"]
        );
        assert_eq!(mwc["webhooks"][0]["failurePolicy"], "Ignore");
        secret["data"].clone()
    };
    let before = webhook_tls(cluster);
    let out = run_helm(&[
        OsStr::new("upgrade"),
        OsStr::new(&release.name),
        chart_dir().as_os_str(),
        OsStr::new("--namespace"),
        OsStr::new(&release.namespace),
        OsStr::new("--kubeconfig"),
        cluster.kubeconfig.as_os_str(),
        OsStr::new("--wait=false"),
    ]);
    assert!(out.status.success(), "helm upgrade: {}", helm_stderr(&out));
    assert_eq!(
        webhook_tls(cluster),
        before,
        "the certificate survives helm upgrade"
    );
    release.uninstall(cluster);
}

// ----------------------------------------------------------------------------------------------
// (d) each rule removed in turn
// ----------------------------------------------------------------------------------------------

/// One permission taken away.
#[derive(Clone, Copy)]
struct Removal {
    group: &'static str,
    resource: &'static str,
    verb: &'static str,
    /// The Lease Role instead of the ClusterRole.
    lease: bool,
    /// Granted but not used by the controller (removing it changes nothing).
    unused: bool,
}

const fn rm(group: &'static str, resource: &'static str, verb: &'static str) -> Removal {
    Removal {
        group,
        resource,
        verb,
        lease: false,
        unused: false,
    }
}

impl Removal {
    fn name(&self) -> String {
        let g = if self.group.is_empty() {
            "core"
        } else {
            self.group
        };
        format!("{} {}/{}", self.verb, g, self.resource)
    }

    /// How the API server words the refusal.
    fn refusal(&self) -> String {
        format!(
            "cannot {} resource \"{}\" in API group \"{}\"",
            self.verb, self.resource, self.group
        )
    }
}

/// `rules` without `verb` on `group`/`resource`; other groups, resources and verbs of the same
/// rule are kept.
fn without(rules: &[PolicyRule], r: &Removal) -> Vec<PolicyRule> {
    let mut out = Vec::new();
    for rule in rules {
        let groups = rule.api_groups.clone().unwrap_or_default();
        let resources = rule.resources.clone().unwrap_or_default();
        let hit = groups.iter().any(|g| g == r.group)
            && resources.iter().any(|x| x == r.resource)
            && rule.verbs.iter().any(|v| v == r.verb);
        if !hit {
            out.push(rule.clone());
            continue;
        }
        // Split the rule: everything else as it was, then the one group/resource minus the verb.
        let other_groups: Vec<String> = groups.iter().filter(|g| *g != r.group).cloned().collect();
        if !other_groups.is_empty() {
            out.push(PolicyRule {
                api_groups: Some(other_groups),
                ..rule.clone()
            });
        }
        let other_resources: Vec<String> = resources
            .iter()
            .filter(|x| *x != r.resource)
            .cloned()
            .collect();
        if !other_resources.is_empty() {
            out.push(PolicyRule {
                api_groups: Some(vec![r.group.to_string()]),
                resources: Some(other_resources),
                ..rule.clone()
            });
        }
        let verbs: Vec<String> = rule
            .verbs
            .iter()
            .filter(|v| *v != r.verb)
            .cloned()
            .collect();
        if !verbs.is_empty() {
            out.push(PolicyRule {
                api_groups: Some(vec![r.group.to_string()]),
                resources: Some(vec![r.resource.to_string()]),
                verbs,
                ..rule.clone()
            });
        }
    }
    out
}

/// Replaces the rules of the release's ClusterRole (or Lease Role).
async fn set_rules(client: &Client, release: &Release, lease: bool, rules: Vec<PolicyRule>) {
    if lease {
        let api: Api<Role> = Api::namespaced(client.clone(), &release.namespace);
        let mut role = api.get(&release.role).await.expect("get Role");
        role.rules = Some(rules);
        api.replace(&release.role, &PostParams::default(), &role)
            .await
            .expect("replace Role");
    } else {
        let api: Api<ClusterRole> = Api::all(client.clone());
        let mut role = api
            .get(&release.cluster_role)
            .await
            .expect("get ClusterRole");
        role.rules = Some(rules);
        api.replace(&release.cluster_role, &PostParams::default(), &role)
            .await
            .expect("replace ClusterRole");
    }
}

/// What the controller did without one permission.
struct Outcome {
    /// The log line that names the refused permission, if one appeared.
    refusal_line: Option<String>,
    /// Exit status, if the process ended.
    exited: Option<String>,
    ready: bool,
    /// The PodGroup of the enabled namespace's scheduler-plugins job appeared.
    pod_group_created: bool,
    /// Reconcile errors counted by the metric.
    reconcile_errors: f64,
    /// How long it took to exit on SIGTERM at the end; `None`: killed after 30 s.
    sigterm_exit: Option<Duration>,
    log_tail: String,
}

/// The log line that contains `needle`, if any, with its escapes removed (JSON logs, and
/// errors printed with Debug inside them, escape the quotes of the API server's message).
fn log_line_with(c: &Controller, needle: &str) -> Option<String> {
    let text = std::fs::read_to_string(&c.log).unwrap_or_default();
    text.lines()
        .map(|l| l.replace('\\', ""))
        .find(|l| l.contains(needle))
        .map(|l| l.chars().take(400).collect())
}

/// Runs the controller without `r` and drives it through every path that needs a permission:
/// start-up, caches, a new job on each backend, a dry-run Event, a repeated Event, a suspend.
async fn without_permission(
    cluster: &Cluster,
    client: &Client,
    release: &Release,
    r: &Removal,
) -> Outcome {
    let needle = r.refusal();
    let key = release.arg("--annotation-key").expect("--annotation-key");
    let mut c = controller::spawn(cluster, Some(&release.kubeconfig), &release.args());
    let prefix = format!("rm-{}", r.resource);
    let ns = support::test_namespace(client, &prefix, &[(key, "true")]).await;
    let dry = support::test_namespace(client, &format!("{prefix}-dry"), &[(key, "dry-run")]).await;
    let sp = Backend::SchedulerPlugins;
    let kind = Kind::PyTorchJob;
    jobs::create(client, &ns, kind, &jobs::job(kind, sp, "gang", 1)).await;
    jobs::create(
        client,
        &ns,
        kind,
        &jobs::job(kind, Backend::Volcano, "gang-vc", 1),
    )
    .await;
    jobs::create(client, &dry, kind, &jobs::job(kind, sp, "dry", 1)).await;

    let start = Instant::now();
    let mut second_round = false;
    let mut refusal_line = None;
    let mut exited = None;
    // Long enough for several retries of every path (discovery runs every 2 s, failed reconciles
    // retry after 5 s, leader election every 2 s).
    while start.elapsed() < Duration::from_secs(45) {
        let status = c.child.try_wait().ok().flatten();
        refusal_line = log_line_with(&c, &needle);
        if let Some(status) = status {
            exited = Some(status.to_string());
            break;
        }
        // Found: watch a little longer, to see whether the rest keeps working (past one retry
        // of a failed reconcile, 5 s).
        if refusal_line.is_some() && !r.unused && start.elapsed() > Duration::from_secs(6) {
            break;
        }
        // Once the first round had its chance: a suspend (delete) and a changed dry-run job
        // (a new WouldUpdatePodGroup Event).
        if !second_round && start.elapsed() > Duration::from_secs(12) {
            second_round = true;
            jobs::patch(
                client,
                &ns,
                kind,
                "gang",
                json!({"spec": {"runPolicy": {"suspend": true}}}),
                false,
            )
            .await;
            jobs::patch(
                client,
                &dry,
                kind,
                "dry",
                json!({"spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": 2}}}}),
                false,
            )
            .await;
        }
        if r.unused && second_round && start.elapsed() > Duration::from_secs(25) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let ready = c.get("/readyz").is_some_and(|(code, _)| code == 200);
    let reconcile_errors = c
        .get("/metrics")
        .map(|(_, body)| {
            controller::metric_sum(
                &body,
                "podgroup_sync_reconcile_total",
                &[("result", "error")],
            )
        })
        .unwrap_or(0.0);
    // The PodGroup may be gone again after the suspend; the writes metric remembers.
    let pod_group_created = c
        .get("/metrics")
        .map(|(_, body)| {
            controller::metric_sum(
                &body,
                "podgroup_sync_podgroup_writes_total",
                &[("backend", "scheduler-plugins"), ("op", "create")],
            ) > 0.0
        })
        .unwrap_or(false);
    let log_tail = c.log_tail();
    let sigterm_exit = if exited.is_some() {
        None
    } else {
        stop_within(&mut c, Duration::from_secs(30))
    };
    Outcome {
        refusal_line,
        exited,
        ready,
        pod_group_created,
        reconcile_errors,
        sigterm_exit,
        log_tail,
    }
}

/// SIGTERM, then SIGKILL if the process has not exited within `grace` (as the kubelet does).
/// Returns how long it took to exit on its own, or `None` if it had to be killed.
fn stop_within(c: &mut Controller, grace: Duration) -> Option<Duration> {
    let start = Instant::now();
    let _ = Command::new("kill").arg(c.child.id().to_string()).status();
    while start.elapsed() < grace {
        if let Ok(Some(_)) = c.child.try_wait() {
            return Some(start.elapsed());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = c.child.kill();
    let _ = c.child.wait();
    None
}

/// Leaves the release's Lease absent, or present and held by nobody, so that each case starts
/// alike whatever the previous instance left (a killed leader does not release it).
fn reset_lease(cluster: &Cluster, release: &Release, present: bool) {
    let name = release.arg("--leader-elect-lease-name").expect("a Lease");
    cluster.kubectl_ok(&[
        "delete",
        "lease",
        name,
        "-n",
        &release.namespace,
        "--ignore-not-found",
    ]);
    if present {
        let manifest = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("lease-{}.json", release.namespace));
        let lease = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": name, "namespace": release.namespace},
            "spec": {"leaseDurationSeconds": 1}});
        std::fs::write(&manifest, lease.to_string()).expect("write Lease manifest");
        cluster.kubectl_ok(&["create", "-f", &manifest.display().to_string()]);
    }
}

/// How many removals run at once, each with a release of its own.
const REMOVALS_AT_ONCE: usize = 7;

#[tokio::test]
async fn removing_any_single_rule_makes_the_controller_name_the_missing_permission() {
    let cluster = support::cluster().await;
    let lease = |verb| Removal {
        lease: true,
        ..rm("coordination.k8s.io", "leases", verb)
    };
    let removals = [
        rm("", "namespaces", "list"),
        rm("", "namespaces", "watch"),
        rm("", "limitranges", "list"),
        rm("scheduling.k8s.io", "priorityclasses", "list"),
        rm("scheduling.k8s.io", "priorityclasses", "watch"),
        rm("node.k8s.io", "runtimeclasses", "watch"),
        rm(
            "admissionregistration.k8s.io",
            "validatingadmissionpolicybindings",
            "list",
        ),
        rm("kubeflow.org", "pytorchjobs", "list"),
        rm("kubeflow.org", "pytorchjobs", "watch"),
        rm("scheduling.x-k8s.io", "podgroups", "list"),
        rm("scheduling.x-k8s.io", "podgroups", "create"),
        rm("scheduling.x-k8s.io", "podgroups", "patch"),
        rm("scheduling.x-k8s.io", "podgroups", "delete"),
        rm("scheduling.volcano.sh", "podgroups", "watch"),
        rm("events.k8s.io", "events", "create"),
        rm("events.k8s.io", "events", "list"),
        rm("", "pods", "list"),
        rm("", "pods", "watch"),
        lease("get"),
        lease("update"),
        lease("create"),
    ];

    // Each removal on a release of its own (its own ClusterRole, Lease, annotation key and
    // instance, so no controller acts on another's jobs or PodGroups), a few at a time: each
    // runs on a thread of its own with its own runtime and client.
    let mut report = String::new();
    let mut failures = Vec::new();
    for (wave, chunk) in removals.chunks(REMOVALS_AT_ONCE).enumerate() {
        let threads: Vec<_> = chunk
            .iter()
            .enumerate()
            .map(|(j, r)| {
                let (r, i) = (*r, wave * REMOVALS_AT_ONCE + j);
                std::thread::spawn(move || {
                    tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .expect("runtime")
                        .block_on(one_removal(cluster, i, r))
                })
            })
            .collect();
        for t in threads {
            let (row, failed) = t.join().expect("a removal's thread panicked");
            report.push_str(&row);
            failures.extend(failed);
        }
    }
    // The table, for the record (shown with --nocapture, and on failure).
    eprintln!("RBAC removals:\n{report}");
    if let Some(dir) = &cluster.work_dir {
        let _ = std::fs::write(dir.join("chart-rbac-removals.txt"), &report);
    }
    assert!(
        failures.is_empty(),
        "{}\n\nall removals:\n{report}",
        failures.join("\n")
    );
}

/// One removal, on a release installed for it: its row of the report, and what failed.
async fn one_removal(cluster: &'static Cluster, i: usize, r: Removal) -> (String, Vec<String>) {
    let client = cluster.client().await;
    let release_ns = support::test_namespace(&client, &format!("chart-rbac-{i}"), &[]).await;
    let key = format!("controller.annotationKey=rbac-{i}.podgroup-sync.test/enabled");
    let instance = format!("controller.instance=rbac-{i}");
    let release = install_with(cluster, &release_ns, &[&key, &instance]);
    let original = if r.lease {
        Api::<Role>::namespaced(client.clone(), &release.namespace)
            .get(&release.role)
            .await
            .expect("Role")
            .rules
    } else {
        Api::<ClusterRole>::all(client.clone())
            .get(&release.cluster_role)
            .await
            .expect("ClusterRole")
            .rules
    }
    .unwrap_or_default();
    let rules = without(&original, &r);
    assert_ne!(
        triples(&rules),
        triples(&original),
        "{}: not granted",
        r.name()
    );
    set_rules(&client, &release, r.lease, rules).await;
    // The authorizer sees the change (RBAC is read from a watch cache).
    let resource = if r.group.is_empty() {
        r.resource.to_string()
    } else {
        format!("{}.{}", r.resource, r.group)
    };
    let ns_flag = if r.lease {
        release.namespace.clone()
    } else {
        "default".to_string()
    };
    let sa = format!(
        "system:serviceaccount:{}:{}",
        release.namespace, release.service_account
    );
    support::wait_for(
        &format!("RBAC without {}", r.name()),
        Duration::from_secs(30),
        || async {
            let out = cluster.kubectl(&[
                "auth",
                "can-i",
                r.verb,
                &resource,
                "-n",
                &ns_flag,
                &format!("--as={sa}"),
            ]);
            (String::from_utf8_lossy(&out.stdout).trim() == "no").then_some(())
        },
    )
    .await;

    // Reading and renewing are needed only while the Lease exists; creating only when not.
    reset_lease(cluster, &release, r.lease && r.verb != "create");
    let o = without_permission(cluster, &client, &release, &r).await;
    release.uninstall(cluster);
    verdict(&r, &o)
}

/// The report's row for one removal, and what failed.
fn verdict(r: &Removal, o: &Outcome) -> (String, Vec<String>) {
    let mut failures = Vec::new();
    let verdict = match (&o.exited, &o.refusal_line, r.unused) {
        // A leader that cannot renew steps down by exiting, by design: reported, not a crash.
        (Some(_), Some(_), false)
            if r.lease
                && (o.log_tail.contains("lost the leader Lease")
                    || o.log_tail.contains("leader election ended")) =>
        {
            "clear error, then the leader stepped down (exit)"
        }
        (Some(status), _, _) => {
            failures.push(format!("{}: the controller exited ({status})", r.name()));
            "CRASH"
        }
        (None, Some(_), false) => "clear error",
        (None, None, false) => {
            failures.push(format!(
                "{}: no log line says {:?} (ready={}, PodGroup created={}, reconcile errors={})",
                r.name(),
                r.refusal(),
                o.ready,
                o.pod_group_created,
                o.reconcile_errors
            ));
            "SILENT"
        }
        (None, None, true) => "unused, no effect",
        (None, Some(_), true) => {
            failures.push(format!(
                "{}: thought unused, but the controller needs it",
                r.name()
            ));
            "USED"
        }
    };
    // The leader hands over on SIGTERM whatever it is missing.
    if o.exited.is_none() && o.sigterm_exit.is_none() {
        failures.push(format!("{}: SIGTERM ignored (killed after 30s)", r.name()));
    }
    let mut row = String::new();
    writeln!(
        row,
        "- {:<40} {verdict}; ready={} podgroup-created={} reconcile-errors={} sigterm={}\n    {}",
        r.name(),
        o.ready,
        o.pod_group_created,
        o.reconcile_errors,
        match o.sigterm_exit {
            Some(d) => format!("exited after {:.1}s", d.as_secs_f64()),
            None if o.exited.is_some() => "(had exited)".into(),
            None => "IGNORED (killed after 30s)".into(),
        },
        o.refusal_line
            .as_deref()
            .unwrap_or("(no refusal in the log)"),
    )
    .unwrap();
    if !verdict.starts_with("clear error") && verdict != "unused, no effect" {
        writeln!(row, "    log tail:\n{}", o.log_tail).unwrap();
    }
    (row, failures)
}

/// `helm template | kubectl apply`, twice, with the certificate the controller manages: the
/// second apply leaves the Secret's data and the caBundle the controller wrote as they were,
/// and the webhook keeps answering with a certificate that caBundle trusts.
#[tokio::test]
async fn a_controller_managed_certificate_survives_the_rendering_applied_twice() {
    use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
    use k8s_openapi::api::core::v1::Secret;
    let cluster = support::cluster().await;
    let client = cluster.client().await;
    let ns = support::test_namespace(&client, "chart-cert", &[]).await;
    let out = run_helm(&[
        "template",
        "cert-twice",
        &chart_dir().display().to_string(),
        "--namespace",
        &ns,
        "--set",
        "webhook.certificate.controller=true",
    ]);
    assert!(out.status.success(), "{}", helm_stderr(&out));
    let rendered = std::env::temp_dir().join(format!("cert-twice-{ns}.yaml"));
    std::fs::write(&rendered, &out.stdout).unwrap();
    let apply = || cluster.kubectl_ok(&["apply", "-f", &rendered.display().to_string()]);
    apply();
    let (secret, config) = (
        "cert-twice-podgroup-sync-webhook-tls",
        "cert-twice-podgroup-sync",
    );
    let port = controller::free_port();
    let mut args =
        support::webhook::managed_args(port, &format!("{ns}/{secret}"), config, "127.0.0.1");
    args.extend([
        "--annotation-key".into(),
        "podgroup-sync.test/cert-twice".into(),
    ]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut c = controller::start(cluster, None, &args);
    let configs: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    let state = || async {
        let bundle = configs.get(config).await.ok()?.webhooks?[0]
            .client_config
            .ca_bundle
            .clone()?;
        let data = secrets.get(secret).await.ok()?.data?;
        (!bundle.0.is_empty()).then_some((bundle.0, data))
    };
    let first = support::wait_for(
        "the caBundle and the Secret written",
        Duration::from_secs(30),
        || async { state().await },
    )
    .await;
    apply();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let second = state().await.expect("still there");
    assert_eq!(
        second, first,
        "the second apply changed what the controller wrote"
    );
    // The webhook answers with a certificate the caBundle trusts.
    let ca = std::env::temp_dir().join(format!("cert-twice-{ns}-ca.crt"));
    std::fs::write(&ca, &first.0).unwrap();
    let code = support::stdout_of(
        Command::new("curl")
            .args([
                "-sS",
                "--max-time",
                "10",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
                "--cacert",
            ])
            .arg(&ca)
            .arg(format!("https://127.0.0.1:{port}/healthz")),
    );
    assert_eq!(String::from_utf8_lossy(&code), "200");
    c.stop();
    // The configuration selects every namespace: remove it, and the release's cluster objects.
    cluster.kubectl(&[
        "delete",
        "--wait=false",
        "-f",
        &rendered.display().to_string(),
    ]);
}

/// The `helm test` hook: a pod running `podgroup-sync check` against this release from its own
/// image, with a ServiceAccount and RBAC of its own that exist only during the test; nothing
/// of it without `helmTest.enabled`.
#[test]
fn the_helm_test_hook_checks_the_release_with_rbac_of_its_own() {
    let r = template_with("helm-test", DEFAULTS, &[]).unwrap();
    let hooks: Vec<&Value> =
        r.0.iter()
            .filter(|d| d["metadata"]["annotations"]["helm.sh/hook"] == "test")
            .collect();
    let kinds: BTreeSet<&str> = hooks.iter().map(|d| d["kind"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        BTreeSet::from([
            "ClusterRole",
            "ClusterRoleBinding",
            "Pod",
            "Role",
            "RoleBinding",
            "ServiceAccount"
        ])
    );
    let pod = hooks.iter().find(|d| d["kind"] == "Pod").unwrap();
    let spec = &pod["spec"];
    assert_eq!(
        spec["serviceAccountName"],
        format!("{RELEASE}-podgroup-sync-test")
    );
    assert_eq!(spec["restartPolicy"], "Never");
    assert_eq!(
        pod["metadata"]["labels"]["app.kubernetes.io/component"], "test",
        "not the controller's selector labels"
    );
    let args: Vec<&str> = spec["containers"][0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(args[0], "check");
    assert!(
        args.contains(&format!("--deployment={RELEASE}-podgroup-sync").as_str()),
        "{args:?}"
    );
    assert!(args.contains(&format!("--webhook-configuration={RELEASE}-podgroup-sync").as_str()));
    assert_eq!(
        spec["containers"][0]["securityContext"]["readOnlyRootFilesystem"],
        true
    );
    // The test's RBAC is deleted whatever the outcome; its pod stays for --logs.
    for h in &hooks {
        let policy = h["metadata"]["annotations"]["helm.sh/hook-delete-policy"]
            .as_str()
            .unwrap();
        if h["kind"] == "Pod" {
            assert_eq!(policy, "before-hook-creation");
        } else {
            assert!(
                policy.contains("hook-succeeded") && policy.contains("hook-failed"),
                "{h}"
            );
        }
    }
    let off = template_with(
        "helm-test-off",
        &format!("{DEFAULTS}\nhelmTest:\n  enabled: false\n"),
        &[],
    )
    .unwrap();
    assert!(
        !off.0
            .iter()
            .any(|d| !d["metadata"]["annotations"]["helm.sh/hook"].is_null())
    );
}

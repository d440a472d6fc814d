//! Observability (SPEC §6, §7): the alert rules pass their promtool unit tests, the dashboard and
//! the rules name only metrics the controller exports, and the live `/metrics` of the controller
//! on the real control plane is valid Prometheus text whose values count what happened.
//!
//! promtool comes from Debian's `prometheus` package through `tests/cluster/get-promtool.sh`.

mod support;

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use serde_json::Value;
use support::controller::{self, metric_sum};
use support::jobs::{self, Backend, Kind, wait_pg};

const ENABLED: (&str, &str) = ("podgroup-sync.io/enabled", "true");

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn dashboards() -> PathBuf {
    repo().join("dashboards")
}

/// promtool, fetched once per test binary by get-promtool.sh (which serialises concurrent runs).
fn promtool() -> &'static Path {
    static PROMTOOL: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let found = PROMTOOL.get_or_init(|| {
        let script = repo().join("tests/cluster/get-promtool.sh");
        let out = Command::new(&script)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("running {}: {e}", script.display()))?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        match stdout
            .lines()
            .filter_map(|l| l.strip_prefix("PROMTOOL="))
            .next_back()
        {
            Some(p) if out.status.success() => Ok(PathBuf::from(p)),
            _ => Err(format!(
                "{} failed ({}):\n{}",
                script.display(),
                out.status,
                String::from_utf8_lossy(&out.stderr)
            )),
        }
    });
    match found {
        Ok(p) => p,
        Err(e) => panic!("{e}"),
    }
}

/// Runs promtool with `args` (and `stdin`, if given) and returns its output.
fn run_promtool(args: &[&str], stdin: Option<&str>) -> Output {
    let mut child = Command::new(promtool())
        .args(args)
        .current_dir(repo())
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("running promtool: {e}"));
    if let Some(text) = stdin {
        let mut pipe = child.stdin.take().expect("piped stdin");
        pipe.write_all(text.as_bytes())
            .expect("write promtool stdin");
    }
    child.wait_with_output().expect("wait for promtool")
}

fn describe(out: &Output) -> String {
    format!(
        "exit {}\n--- stdout ---\n{}\n--- stderr ---\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Every family the controller exports, from the library's own registry.
fn exported() -> BTreeSet<String> {
    let metrics = podgroup_sync::metrics::Metrics::new();
    // Registered by the binary when it serves the pod-link webhook.
    podgroup_sync::webhook::admit::AdmissionMetrics::new(&metrics.registry);
    podgroup_sync::webhook::tls::TlsMetrics::new(&metrics.registry);
    // Registered by the binary's API client.
    podgroup_sync::client::Throttle::new(Some(&metrics.registry));
    metrics.metric_names().into_iter().collect()
}

/// The podgroup_sync_* metric names an expression uses, with a histogram's `_bucket`, `_sum` and
/// `_count` series named by their family.
fn metric_names_in(expr: &str) -> BTreeSet<String> {
    const PREFIX: &str = "podgroup_sync_";
    let mut names = BTreeSet::new();
    let mut rest = expr;
    while let Some(at) = rest.find(PREFIX) {
        let before = rest[..at].chars().next_back();
        let tail = &rest[at..];
        let len = tail
            .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(tail.len());
        if !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':') {
            names.insert(tail[..len].to_string());
        }
        rest = &tail[len..];
    }
    names
}

/// The histogram families: only these have `_bucket`, `_sum` and `_count` series.
fn histograms() -> BTreeSet<String> {
    use prometheus::core::Collector;
    let m = podgroup_sync::metrics::Metrics::new();
    let admission = podgroup_sync::webhook::admit::AdmissionMetrics::new(&m.registry);
    [
        &m.reconcile.duration,
        &m.pod_groups.job_to_pod_group,
        &m.pod_groups.gang_wait,
    ]
    .iter()
    .flat_map(|h| h.desc().into_iter().map(|d| d.fq_name.clone()))
    .chain(
        admission
            .duration
            .desc()
            .into_iter()
            .map(|d| d.fq_name.clone()),
    )
    .chain(
        m.health
            .audit_duration
            .desc()
            .into_iter()
            .map(|d| d.fq_name.clone()),
    )
    .collect()
}

/// `name` if exported, else its histogram family when it is a `_bucket`/`_sum`/`_count` series.
fn family<'a>(name: &'a str, exported: &BTreeSet<String>) -> Option<&'a str> {
    if exported.contains(name) {
        return Some(name);
    }
    let histograms = histograms();
    ["_bucket", "_sum", "_count"]
        .iter()
        .filter_map(|s| name.strip_suffix(s))
        .find(|base| exported.contains(*base) && histograms.contains(*base))
}

/// Fails naming every (where, metric) that the controller does not export.
fn assert_exported(uses: &[(String, String)], what: &str) {
    let exported = exported();
    let mut unknown = Vec::new();
    let mut count = 0;
    for (place, expr) in uses {
        for name in metric_names_in(expr) {
            count += 1;
            if family(&name, &exported).is_none() {
                unknown.push(format!("{place}: {name}"));
            }
        }
    }
    assert!(count > 0, "{what} names no podgroup_sync_* metric at all");
    assert!(
        unknown.is_empty(),
        "{what} queries metrics the controller does not export:\n  {}\nexported: {exported:?}",
        unknown.join("\n  ")
    );
}

fn dashboard() -> Value {
    let path = dashboards().join("podgroup-sync.json");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()))
}

/// Every panel, rows' nested panels included.
fn panels(dash: &Value) -> Vec<&Value> {
    fn walk<'a>(list: &'a Value, out: &mut Vec<&'a Value>) {
        for p in list.as_array().into_iter().flatten() {
            out.push(p);
            walk(&p["panels"], out);
        }
    }
    let mut out = Vec::new();
    walk(&dash["panels"], &mut out);
    out
}

/// (panel or variable, PromQL) of every query in the dashboard: panel targets and variables.
fn dashboard_queries(dash: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for p in panels(dash) {
        for t in p["targets"].as_array().into_iter().flatten() {
            if let Some(expr) = t["expr"].as_str() {
                out.push((format!("panel {:?}", p["title"]), expr.to_string()));
            }
        }
    }
    for v in dash["templating"]["list"].as_array().into_iter().flatten() {
        let query = v["query"]["query"].as_str().or(v["query"].as_str());
        if v["type"] == "query"
            && let Some(q) = query
        {
            out.push((format!("variable {:?}", v["name"]), q.to_string()));
        }
    }
    out
}

/// Every `uid` of every `datasource` object (or a legacy datasource string), with its JSON path.
fn datasource_refs(v: &Value, path: String, out: &mut Vec<(String, String)>) {
    match v {
        Value::Object(map) => {
            for (k, child) in map {
                let here = format!("{path}.{k}");
                if k == "datasource" {
                    match child {
                        Value::String(s) => out.push((here.clone(), s.clone())),
                        Value::Object(ds) => {
                            if let Some(uid) = ds.get("uid") {
                                out.push((here.clone(), uid.as_str().unwrap_or("").to_string()));
                            }
                        }
                        _ => {}
                    }
                }
                datasource_refs(child, here, out);
            }
        }
        Value::Array(items) => {
            for (i, child) in items.iter().enumerate() {
                datasource_refs(child, format!("{path}[{i}]"), out);
            }
        }
        _ => {}
    }
}

fn alert_rules() -> serde_yaml_ng::Value {
    let path = dashboards().join("alerts.yaml");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("{} is not YAML: {e}", path.display()))
}

/// Every rule of every group of alerts.yaml.
fn rules(file: &serde_yaml_ng::Value) -> Vec<&serde_yaml_ng::Value> {
    file["groups"]
        .as_sequence()
        .into_iter()
        .flatten()
        .flat_map(|g| g["rules"].as_sequence().into_iter().flatten())
        .collect()
}

#[test]
fn alert_rules_are_valid_and_pass_their_promtool_unit_tests() {
    let check = run_promtool(&["check", "rules", "dashboards/alerts.yaml"], None);
    assert!(
        check.status.success(),
        "promtool check rules:\n{}",
        describe(&check)
    );
    let test = run_promtool(&["test", "rules", "dashboards/alerts_test.yaml"], None);
    assert!(
        test.status.success(),
        "promtool test rules:\n{}",
        describe(&test)
    );
}

#[test]
fn every_alert_has_a_test_where_it_fires_and_one_where_it_stays_silent() {
    let path = dashboards().join("alerts_test.yaml");
    let tests: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(&path).expect("read alerts_test.yaml"))
            .expect("alerts_test.yaml is YAML");
    let mut fires = BTreeSet::new();
    let mut silent = BTreeSet::new();
    for case in tests["tests"].as_sequence().into_iter().flatten() {
        for t in case["alert_rule_test"].as_sequence().into_iter().flatten() {
            let name = t["alertname"].as_str().unwrap_or_default().to_string();
            if t["exp_alerts"].as_sequence().is_some_and(|a| !a.is_empty()) {
                fires.insert(name);
            } else {
                silent.insert(name);
            }
        }
    }
    let file = alert_rules();
    let alerts: Vec<&str> = rules(&file)
        .iter()
        .filter_map(|r| r["alert"].as_str())
        .collect();
    assert!(!alerts.is_empty(), "alerts.yaml has no alert");
    for alert in alerts {
        assert!(
            fires.contains(alert),
            "no test in alerts_test.yaml where {alert} fires"
        );
        assert!(
            silent.contains(alert),
            "no test in alerts_test.yaml where {alert} stays silent"
        );
    }
}

#[test]
fn every_alert_waits_has_a_severity_and_tells_what_to_do() {
    let file = alert_rules();
    for rule in rules(&file) {
        let Some(alert) = rule["alert"].as_str() else {
            continue;
        };
        assert!(rule["for"].as_str().is_some(), "{alert} has no for:");
        assert!(
            matches!(
                rule["labels"]["severity"].as_str(),
                Some("critical" | "warning" | "info")
            ),
            "{alert} has no severity label of critical, warning or info"
        );
        for key in ["summary", "description", "runbook"] {
            assert!(
                rule["annotations"][key]
                    .as_str()
                    .is_some_and(|s| !s.trim().is_empty()),
                "{alert} has no {key} annotation"
            );
        }
    }
}

#[test]
fn alert_rules_query_only_exported_metrics() {
    let file = alert_rules();
    let uses: Vec<(String, String)> = rules(&file)
        .iter()
        .map(|r| {
            let name = r["alert"].as_str().or(r["record"].as_str()).unwrap_or("?");
            (
                format!("rule {name}"),
                r["expr"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    assert_exported(&uses, "alerts.yaml");
}

#[test]
fn dashboard_queries_only_exported_metrics() {
    assert_exported(&dashboard_queries(&dashboard()), "podgroup-sync.json");
}

#[test]
fn dashboard_takes_its_datasource_from_a_variable() {
    let dash = dashboard();
    let var = dash["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|v| v["type"] == "datasource" && v["name"] == "datasource")
        .expect("a datasource template variable named `datasource`");
    assert_eq!(
        var["query"], "prometheus",
        "the datasource variable lists Prometheus sources"
    );
    let mut refs = Vec::new();
    datasource_refs(&dash, "$".into(), &mut refs);
    assert!(!refs.is_empty(), "no panel names its datasource");
    let hard_coded: Vec<String> = refs
        .iter()
        .filter(|(_, uid)| uid != "${datasource}" && uid != "$datasource")
        .map(|(path, uid)| format!("{path} = {uid:?}"))
        .collect();
    assert!(
        hard_coded.is_empty(),
        "hard-coded datasource uids (use ${{datasource}}):\n  {}",
        hard_coded.join("\n  ")
    );
    assert!(
        dash.get("__inputs").is_none(),
        "an exported __inputs block pins a datasource"
    );
}

#[test]
fn dashboard_panels_have_unique_ids_queries_and_no_overlap() {
    let dash = dashboard();
    assert!(
        dash["schemaVersion"].as_i64().is_some_and(|v| v >= 36),
        "schemaVersion too old"
    );
    let all = panels(&dash);
    let mut ids = BTreeSet::new();
    let mut boxes = Vec::new();
    for p in &all {
        let title = p["title"].as_str().unwrap_or("?");
        assert!(
            ids.insert(p["id"].as_i64().expect("panel id")),
            "duplicate panel id at {title}"
        );
        let g = &p["gridPos"];
        let rect = ["x", "y", "w", "h"].map(|k| g[k].as_i64().expect("gridPos"));
        assert!(rect[0] + rect[2] <= 24, "{title} is wider than the grid");
        boxes.push((title, rect));
        if p["type"] != "row" {
            let targets = p["targets"]
                .as_array()
                .map(Vec::as_slice)
                .unwrap_or_default();
            assert!(!targets.is_empty(), "{title} has no query");
            for t in targets {
                assert!(
                    t["expr"].as_str().is_some_and(|e| !e.trim().is_empty()),
                    "{title} has an empty query"
                );
            }
        }
    }
    for (i, (a, ra)) in boxes.iter().enumerate() {
        for (b, rb) in &boxes[i + 1..] {
            let overlap = ra[0] < rb[0] + rb[2]
                && rb[0] < ra[0] + ra[2]
                && ra[1] < rb[1] + rb[3]
                && rb[1] < ra[1] + ra[3];
            assert!(!overlap, "panels {a:?} and {b:?} overlap");
        }
    }
}

#[test]
fn dashboard_queries_are_valid_promql() {
    // promtool has no query linter of its own: every query becomes a recording rule, with
    // Grafana's variables replaced by values Prometheus accepts.
    let dash = dashboard();
    let mut file = String::from("groups:\n  - name: dashboard\n    rules:\n");
    let queries = dashboard_queries(&dash);
    for (i, (_, expr)) in queries.iter().enumerate() {
        let expr = expr
            .replace("$__rate_interval", "5m")
            .replace("$__interval", "1m")
            .replace("$window", "30m")
            .replace("$namespace", ".*")
            .replace("$job", ".*");
        let expr = if expr.starts_with("label_values(") {
            // label_values(METRIC{...}, LABEL) is Grafana's; its selector must be valid PromQL.
            let inner = &expr["label_values(".len()..expr.rfind(',').expect("label_values(m, l)")];
            inner.to_string()
        } else {
            expr
        };
        file.push_str(&format!(
            "      - record: dashboard:query_{i}\n        expr: {}\n",
            serde_json::to_string(&expr).unwrap()
        ));
    }
    let dir = std::env::temp_dir().join(format!("podgroup-sync-dash-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("dashboard-queries.yaml");
    std::fs::write(&path, &file).unwrap();
    let out = run_promtool(&["check", "rules", path.to_str().unwrap()], None);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        out.status.success(),
        "dashboard queries:\n{file}\n{}",
        describe(&out)
    );
}

#[test]
fn metric_names_are_found_in_expressions() {
    let names = metric_names_in(
        "histogram_quantile(0.9, sum by (le) (rate(podgroup_sync_gang_wait_seconds_bucket{a=\"b\"}[5m]))) / x_podgroup_sync_other + podgroup_sync_leader",
    );
    assert_eq!(
        names,
        BTreeSet::from([
            "podgroup_sync_gang_wait_seconds_bucket".into(),
            "podgroup_sync_leader".into()
        ])
    );
    let exported = exported();
    assert_eq!(
        family("podgroup_sync_gang_wait_seconds_bucket", &exported),
        Some("podgroup_sync_gang_wait_seconds")
    );
    assert_eq!(family("podgroup_sync_leader_bucket", &exported), None);
    assert_eq!(family("podgroup_sync_nonexistent_total", &exported), None);
}

/// Three PyTorchJobs get their PodGroups, one PodGroup is deleted by hand and recreated; then the
/// live /metrics passes `promtool check metrics` and counts exactly those four creations.
#[tokio::test]
async fn live_metrics_are_valid_and_count_the_podgroups_created() {
    let cluster = support::cluster().await;
    let ctl = controller::start(cluster, None, &[]);
    let client = cluster.client().await;
    let ns = support::test_namespace(&client, "observability", &[ENABLED]).await;
    let backend = Backend::SchedulerPlugins;
    let names = ["obs-a", "obs-b", "obs-c"];
    for name in names {
        jobs::create(
            &client,
            &ns,
            Kind::PyTorchJob,
            &jobs::job(Kind::PyTorchJob, backend, name, 1),
        )
        .await;
    }
    let mut first = None;
    for name in names {
        let pg = wait_pg(&client, &ns, backend, name, "created", |_| true).await;
        first.get_or_insert(pg);
    }
    let first = first.unwrap();
    jobs::delete(&client, &ns, &backend.ar(), names[0]).await;
    wait_pg(
        &client,
        &ns,
        backend,
        names[0],
        "recreated after a manual delete",
        |pg| pg.metadata.uid != first.metadata.uid,
    )
    .await;

    // The counters move right after the API server answers: wait for them, then demand equality.
    let created = 4.0;
    support::wait_for(
        "4 PodGroup creations counted",
        Duration::from_secs(60),
        || {
            let text = ctl.metrics();
            let counted = metric_sum(
                &text,
                "podgroup_sync_podgroup_writes_total",
                &[("op", "create")],
            );
            let observed = metric_sum(&text, "podgroup_sync_job_to_podgroup_seconds_count", &[]);
            std::future::ready((counted >= created && observed >= created).then_some(()))
        },
    )
    .await;
    // The PodGroup gauge is refreshed from the caches on every discovery turn (2s here).
    support::wait_for(
        "3 PodGroups in podgroup_sync_podgroups",
        Duration::from_secs(60),
        || {
            let text = ctl.metrics();
            let owned = metric_sum(
                &text,
                "podgroup_sync_podgroups",
                &[("backend", "scheduler-plugins")],
            );
            std::future::ready((owned == 3.0).then_some(()))
        },
    )
    .await;
    // Give a stray extra create a moment to show, then read the final numbers.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let text = ctl.metrics();

    let check = run_promtool(&["check", "metrics"], Some(&text));
    eprintln!(
        "promtool check metrics on the live /metrics:\n{}",
        describe(&check)
    );
    if let Ok(path) = std::env::var("PGS_DUMP_METRICS") {
        std::fs::write(path, &text).expect("write PGS_DUMP_METRICS");
    }
    assert!(
        check.status.success(),
        "promtool check metrics rejects the live /metrics:\n{}\n--- /metrics ---\n{text}",
        describe(&check)
    );

    let m = |name: &str, labels: &[(&str, &str)]| metric_sum(&text, name, labels);
    let log = || ctl.log_tail();
    assert_eq!(
        m("podgroup_sync_podgroup_writes_total", &[("op", "create")]),
        created,
        "PodGroup creations counted (3 jobs + 1 recreation)\n{}",
        log()
    );
    assert_eq!(
        m(
            "podgroup_sync_podgroup_writes_total",
            &[("backend", "scheduler-plugins"), ("op", "create")]
        ),
        created,
        "creations are counted under the backend that got them"
    );
    assert_eq!(
        m(
            "podgroup_sync_job_to_podgroup_seconds_count",
            &[("backend", "scheduler-plugins")]
        ),
        created,
        "one job → PodGroup latency observation per creation"
    );
    assert_eq!(
        m(
            "podgroup_sync_podgroups",
            &[("backend", "scheduler-plugins")]
        ),
        3.0,
        "owned PodGroups, all phases"
    );
    assert_eq!(m("podgroup_sync_podgroups", &[("backend", "volcano")]), 0.0);
    assert!(
        m("podgroup_sync_reconcile_total", &[]) > 0.0,
        "no reconcile counted"
    );
    assert!(
        m(
            "podgroup_sync_reconcile_total",
            &[("kind", "PyTorchJob"), ("result", "ok")]
        ) >= 4.0,
        "PyTorchJob reconciles that created PodGroups are counted as ok"
    );
    assert_eq!(
        m("podgroup_sync_reconcile_total", &[("result", "error")]),
        0.0,
        "{}",
        log()
    );
    assert_eq!(
        m(
            "podgroup_sync_watched_kinds",
            &[("kind", "PyTorchJob"), ("served", "true")]
        ),
        1.0
    );
    assert_eq!(
        m(
            "podgroup_sync_watched_kinds",
            &[("kind", "PyTorchJob"), ("served", "false")]
        ),
        0.0
    );
    assert_eq!(
        m(
            "podgroup_sync_backend_served",
            &[("backend", "scheduler-plugins")]
        ),
        1.0
    );
    assert_eq!(
        m("podgroup_sync_leader", &[]),
        1.0,
        "a single replica without election leads"
    );
    assert!(m("podgroup_sync_managed_namespaces", &[("mode", "true")]) >= 1.0);
    assert_eq!(
        m(
            "podgroup_sync_build_info",
            &[("version", env!("CARGO_PKG_VERSION"))]
        ),
        1.0
    );
    assert_eq!(
        ctl.get("/readyz").map(|(code, _)| code),
        Some(200),
        "/readyz after the lifecycle"
    );
    assert_eq!(
        ctl.get("/healthz").map(|(code, _)| code),
        Some(200),
        "/healthz"
    );

    // Every family in the live exposition is one the library says it exports.
    let exported = exported();
    let live: BTreeSet<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    let unknown: Vec<&&str> = live.iter().filter(|n| !exported.contains(**n)).collect();
    assert!(
        unknown.is_empty(),
        "live families missing from metric_names(): {unknown:?}"
    );
}

//! Faults injected into a control plane of the test's own ([`super::private_cluster`]): its
//! processes killed, stopped and started again with the same command line (same ports, same
//! data), etcd compacted, the API server throttled for one ServiceAccount.
//!
//! A process started again is appended to the work directory's `pids`, so that stop.sh and the
//! reaper stop it like the ones start.sh started.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::Cluster;

/// A control-plane process: its PID and the command line it was started with.
#[derive(Debug, Clone)]
pub struct Proc {
    pub pid: u32,
    pub argv: Vec<String>,
}

fn work_dir(cluster: &Cluster) -> PathBuf {
    cluster
        .work_dir
        .clone()
        .expect("a fault test needs a control plane of its own (support::private_cluster)")
}

fn argv_of(pid: u32) -> Option<Vec<String>> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let argv: Vec<String> = raw
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    (!argv.is_empty()).then_some(argv)
}

/// The running process of the control plane whose program is `binary` (e.g. `kube-apiserver`).
pub fn process(cluster: &Cluster, binary: &str) -> Proc {
    let pids = std::fs::read_to_string(work_dir(cluster).join("pids")).expect("pids file");
    pids.lines()
        .filter_map(|l| l.trim().parse::<u32>().ok())
        .filter_map(|pid| Some((pid, argv_of(pid)?)))
        .find(|(_, argv)| argv[0].ends_with(&format!("/{binary}")))
        .map(|(pid, argv)| Proc { pid, argv })
        .unwrap_or_else(|| panic!("no running {binary} in the control plane"))
}

/// Sends `signal` (e.g. "KILL", "TERM") to `pid`.
pub fn signal(pid: u32, signal: &str) {
    let status = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -{signal} {pid} failed");
}

/// Kills `p` with SIGKILL and waits until it is gone.
pub fn kill9(p: &Proc) {
    signal(p.pid, "KILL");
    wait_gone(p.pid);
}

/// Stops `p` with SIGTERM and waits until it is gone (SIGKILL after 20 s).
pub fn stop(p: &Proc) {
    signal(p.pid, "TERM");
    let deadline = Instant::now() + Duration::from_secs(20);
    while alive(p.pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    if alive(p.pid) {
        kill9(p);
    }
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(") ").map(|(_, rest)| !rest.starts_with('Z')))
        .unwrap_or(false)
}

fn wait_gone(pid: u32) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while alive(pid) {
        assert!(Instant::now() < deadline, "PID {pid} still alive");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Starts `p`'s command line again (its log goes to WORK_DIR/<binary>-restarted.log) and
/// records the new PID for stop.sh. A process that exits at once — its port still held by
/// connections of the killed one — is started again, for up to 60 s.
pub fn relaunch(cluster: &Cluster, p: &Proc) -> Proc {
    let dir = work_dir(cluster);
    let name = p.argv[0]
        .rsplit('/')
        .next()
        .unwrap_or("process")
        .to_string();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join(format!("{name}-restarted.log")))
            .expect("log file");
        let mut child = Command::new(&p.argv[0])
            .args(&p.argv[1..])
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("relaunch {name}: {e}"));
        let pid = child.id();
        let mut pids = std::fs::OpenOptions::new()
            .append(true)
            .open(dir.join("pids"))
            .expect("pids file");
        writeln!(pids, "{pid}").expect("record pid");
        std::thread::sleep(Duration::from_millis(1500));
        match child.try_wait() {
            Ok(Some(status)) => {
                assert!(
                    Instant::now() < deadline,
                    "{name} keeps exiting ({status}); see {name}-restarted.log"
                );
                std::thread::sleep(Duration::from_secs(1));
            }
            _ => {
                // Not waited for here: stop.sh (or the reaper) ends it by PID; the zombie is
                // reaped when this test process exits.
                std::mem::forget(child);
                return Proc {
                    pid,
                    argv: p.argv.clone(),
                };
            }
        }
    }
}

/// The control plane's `env` value of `key` (API_URL, ETCD_URL, …).
pub fn env(cluster: &Cluster, key: &str) -> String {
    let out = Command::new("bash")
        .args(["-c", r#"source "$1" && printf %s "${!2}""#, "bash"])
        .arg(work_dir(cluster).join("env"))
        .arg(key)
        .output()
        .expect("read env");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Waits (up to 120 s) until the API server answers /readyz with "ok"; returns when it did.
pub fn wait_api_ready(cluster: &Cluster) -> Instant {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let out = cluster.kubectl(&["get", "--raw", "/readyz", "--request-timeout=2s"]);
        if out.status.success() && String::from_utf8_lossy(&out.stdout).trim() == "ok" {
            return Instant::now();
        }
        assert!(
            Instant::now() < deadline,
            "API server not ready after 120 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// etcd's current revision, through its JSON gateway.
fn etcd_revision(etcd_url: &str) -> i64 {
    let out = curl_json(etcd_url, "/v3/kv/range", r#"{"key":"AA=="}"#);
    let v: serde_json::Value = serde_json::from_str(&out).expect("etcd range answer");
    v["header"]["revision"]
        .as_str()
        .and_then(|r| r.parse().ok())
        .unwrap_or_else(|| panic!("no revision in {out}"))
}

fn curl_json(base: &str, path: &str, body: &str) -> String {
    let out = super::stdout_of(
        Command::new("curl")
            .args(["-sS", "--max-time", "10", "-X", "POST", "-d", body])
            .arg(format!("{base}{path}")),
    );
    String::from_utf8_lossy(&out).into_owned()
}

/// Compacts etcd's history up to its current revision: a watch that resumes from an earlier
/// resourceVersion is then answered 410 Gone and must relist.
pub fn compact_etcd(cluster: &Cluster) -> i64 {
    let url = env(cluster, "ETCD_URL");
    let rev = etcd_revision(&url);
    curl_json(
        &url,
        "/v3/kv/compaction",
        &format!(r#"{{"revision":"{rev}","physical":true}}"#),
    );
    rev
}

/// A kubeconfig for ServiceAccount `namespace/name`, bound to cluster-admin (throttling, not
/// RBAC, is under test), with a token from the TokenRequest API.
pub fn service_account_kubeconfig(cluster: &Cluster, namespace: &str, name: &str) -> PathBuf {
    cluster.kubectl_ok(&["-n", namespace, "create", "serviceaccount", name]);
    cluster.kubectl_ok(&[
        "create",
        "clusterrolebinding",
        &format!("{namespace}-{name}"),
        "--clusterrole=cluster-admin",
        &format!("--serviceaccount={namespace}:{name}"),
    ]);
    let token = cluster.kubectl_ok(&["-n", namespace, "create", "token", name, "--duration=2h"]);
    let server = env(cluster, "API_URL");
    let ca = work_dir(cluster).join("pki/ca.crt");
    let path = work_dir(cluster).join(format!("{name}.kubeconfig"));
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: {server}\n    certificate-authority: {}\nusers:\n- name: sa\n  user:\n    token: {}\ncontexts:\n- name: test\n  context: {{cluster: test, user: sa}}\ncurrent-context: test\n",
        ca.display(),
        token.trim()
    );
    std::fs::write(&path, text).expect("write kubeconfig");
    path
}

/// API Priority and Fairness objects that give ServiceAccount `namespace/name` a priority level
/// of its own with the smallest concurrency the server allows, nothing borrowed, and requests
/// beyond it rejected with 429.
pub fn throttle_service_account(cluster: &Cluster, namespace: &str, name: &str) {
    let manifest = format!(
        r#"apiVersion: flowcontrol.apiserver.k8s.io/v1
kind: PriorityLevelConfiguration
metadata:
  name: pgs-throttle
spec:
  type: Limited
  limited:
    nominalConcurrencyShares: 1
    lendablePercent: 0
    borrowingLimitPercent: 0
    limitResponse:
      type: Reject
---
apiVersion: flowcontrol.apiserver.k8s.io/v1
kind: FlowSchema
metadata:
  name: pgs-throttle
spec:
  priorityLevelConfiguration:
    name: pgs-throttle
  matchingPrecedence: 500
  distinguisherMethod:
    type: ByUser
  rules:
  - subjects:
    - kind: ServiceAccount
      serviceAccount:
        name: {name}
        namespace: {namespace}
    resourceRules:
    - verbs: ["*"]
      apiGroups: ["*"]
      resources: ["*"]
      clusterScope: true
      namespaces: ["*"]
    nonResourceRules:
    - verbs: ["*"]
      nonResourceURLs: ["*"]
"#
    );
    let dir = work_dir(cluster);
    let file = dir.join("throttle.yaml");
    std::fs::write(&file, manifest).expect("write throttle.yaml");
    cluster.kubectl_ok(&["apply", "-f", &file.display().to_string()]);
}

/// A loopback TCP proxy in front of the API server that can stall: while stalled it neither
/// reads nor forwards a byte in either direction, and keeps every connection open (a network
/// that silently stops delivering); when released, what waited is forwarded.
pub struct StallingProxy {
    pub port: u16,
    stalled: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl StallingProxy {
    /// Listens on a loopback port and forwards each connection to `target`.
    pub async fn start(target: std::net::SocketAddr) -> StallingProxy {
        use std::sync::Arc;
        use std::sync::atomic::AtomicBool;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind proxy");
        let port = listener.local_addr().unwrap().port();
        let stalled = Arc::new(AtomicBool::new(false));
        let flag = stalled.clone();
        tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    continue;
                };
                let flag = flag.clone();
                tokio::spawn(async move {
                    let Ok(server) = tokio::net::TcpStream::connect(target).await else {
                        return;
                    };
                    let (cr, cw) = client.into_split();
                    let (sr, sw) = server.into_split();
                    tokio::join!(pump(cr, sw, flag.clone()), pump(sr, cw, flag));
                });
            }
        });
        StallingProxy { port, stalled }
    }

    pub fn stall(&self, on: bool) {
        self.stalled.store(on, std::sync::atomic::Ordering::SeqCst);
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    stalled: std::sync::Arc<std::sync::atomic::AtomicBool>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let held = || async {
        while stalled.load(std::sync::atomic::Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        held().await;
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        // Bytes read just as the stall began wait for its end too.
        held().await;
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}

/// A copy of kubeconfig `path` whose server is `https://127.0.0.1:<port>` (a proxy's).
pub fn kubeconfig_via(path: &std::path::Path, port: u16) -> PathBuf {
    let text = std::fs::read_to_string(path).expect("read kubeconfig");
    let out: Vec<String> = text
        .lines()
        .map(|l| match l.split_once("server: ") {
            Some((indent, _)) => format!("{indent}server: https://127.0.0.1:{port}"),
            None => l.to_string(),
        })
        .collect();
    let via = path.with_extension(format!("via-{port}.kubeconfig"));
    std::fs::write(&via, out.join("\n") + "\n").expect("write kubeconfig");
    via
}

/// One PodGroup write the API server completed, from its audit log (`AUDIT=1`).
#[derive(Debug, Clone)]
pub struct AuditedWrite {
    pub user: String,
    pub verb: String,
    pub namespace: String,
    pub name: String,
    pub code: u16,
    /// When the API server finished it (RFC 3339, microseconds: sorts as text).
    pub at: String,
}

/// The PodGroup writes in the control plane's audit log, in the order they completed.
pub fn audited_writes(cluster: &Cluster) -> Vec<AuditedWrite> {
    let text = std::fs::read_to_string(work_dir(cluster).join("audit.log")).unwrap_or_default();
    let mut writes: Vec<AuditedWrite> = text
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|e| e["stage"] == "ResponseComplete")
        .map(|e| AuditedWrite {
            user: e["user"]["username"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            verb: e["verb"].as_str().unwrap_or_default().to_string(),
            namespace: e["objectRef"]["namespace"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            name: e["objectRef"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            code: e["responseStatus"]["code"].as_u64().unwrap_or(0) as u16,
            at: e["stageTimestamp"].as_str().unwrap_or_default().to_string(),
        })
        .collect();
    writes.sort_by(|a, b| a.at.cmp(&b.at));
    writes
}

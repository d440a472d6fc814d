//! Runs the real `podgroup-sync` binary against the test control plane.
//!
//! The process is tethered to the test binary: a detached watchdog kills it when the test
//! process exits, so a failing test leaks nothing.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::Cluster;

/// A running controller process.
pub struct Controller {
    pub child: Child,
    pub addr: SocketAddr,
    pub log: PathBuf,
}

/// A loopback port nothing listens on now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// Starts the controller with the admin kubeconfig (or `kubeconfig`) and `args`, without
/// waiting for it (a missing permission, for one, may keep it unready).
pub fn spawn(cluster: &Cluster, kubeconfig: Option<&std::path::Path>, args: &[&str]) -> Controller {
    let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let dir = cluster.work_dir.clone().unwrap_or_else(std::env::temp_dir);
    let log = dir.join(format!("podgroup-sync-{}.log", addr.port()));
    let log_file = std::fs::File::create(&log).expect("controller log file");
    let kubeconfig = kubeconfig.unwrap_or(&cluster.kubeconfig);
    // PGS_CONTROLLER_BIN runs another build (e.g. an older commit) under the same tests.
    let bin = std::env::var("PGS_CONTROLLER_BIN")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_podgroup-sync").to_string());
    let child = Command::new(bin)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .arg("--http-addr")
        .arg(addr.to_string())
        .args(["--discovery-interval-seconds", "2"])
        .args(args)
        .env(
            "PODGROUP_SYNC_LOG",
            std::env::var("PGS_CONTROLLER_LOG")
                .unwrap_or_else(|_| "info,podgroup_sync=debug".into()),
        )
        .stdin(Stdio::null())
        .stdout(log_file.try_clone().unwrap())
        .stderr(log_file)
        .spawn()
        .expect("spawn podgroup-sync");
    tether(child.id());
    Controller { child, addr, log }
}

/// Flags for a leader-elected candidate with short timings (lease 6 s, renew deadline 4 s,
/// retry 1 s), its Lease in `lease_namespace`, named `identity`.
pub fn leader_args(lease_namespace: &str, identity: &str) -> Vec<String> {
    [
        "--leader-elect",
        "--leader-elect-namespace",
        lease_namespace,
        "--leader-elect-lease-duration-seconds",
        "6",
        "--leader-elect-renew-deadline-seconds",
        "4",
        "--leader-elect-retry-period-seconds",
        "1",
        "--leader-elect-identity",
        identity,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// [`spawn`], then waits until `/readyz` answers 200.
pub fn start(cluster: &Cluster, kubeconfig: Option<&std::path::Path>, args: &[&str]) -> Controller {
    let mut c = spawn(cluster, kubeconfig, args);
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        if let Ok(Some(status)) = c.child.try_wait() {
            panic!("podgroup-sync exited with {status}:\n{}", c.log_tail());
        }
        if c.get("/readyz").is_some_and(|(code, _)| code == 200) {
            return c;
        }
        if Instant::now() > deadline {
            panic!("podgroup-sync not ready after 90s:\n{}", c.log_tail());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

impl Controller {
    /// A plain HTTP/1.0 GET; `(status code, body)`.
    pub fn get(&self, path: &str) -> Option<(u16, String)> {
        http_get(self.addr, path)
    }

    pub fn metrics(&self) -> String {
        self.get("/metrics").expect("GET /metrics").1
    }

    /// Sum of a metric's samples whose labels include every `label="value"` given.
    pub fn metric(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        metric_sum(&self.metrics(), name, labels)
    }

    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// SIGTERM, then wait for a graceful exit.
    pub fn stop(&mut self) {
        let _ = Command::new("kill")
            .arg(self.child.id().to_string())
            .status();
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Kills process `pid` (with SIGKILL) when this process goes away, however it ends: a detached
/// watcher that polls this process once a second.
pub fn tether(pid: u32) {
    let _ = Command::new("setsid")
        .args([
            "bash",
            "-c",
            "while kill -0 \"$1\" 2>/dev/null; do sleep 1; done; kill -9 \"$2\" 2>/dev/null",
            "pgs-tether",
        ])
        .arg(std::process::id().to_string())
        .arg(pid.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
}

impl Drop for Controller {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A plain HTTP/1.0 GET on loopback: `(status code, body)`; `None` when it cannot connect or
/// the answer does not come within 10 s.
pub fn http_get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").ok()?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).ok()?;
    let code = buf.split_whitespace().nth(1)?.parse().ok()?;
    let body = buf
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Some((code, body))
}

/// Sum of the samples of `name` in a Prometheus text exposition whose labels include `labels`.
pub fn metric_sum(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let (metric, rest) = match series.split_once('{') {
                Some((m, r)) => (m, r.trim_end_matches('}')),
                None => (series, ""),
            };
            if metric != name {
                return None;
            }
            let ok = labels
                .iter()
                .all(|(k, v)| rest.split(',').any(|kv| kv == format!("{k}=\"{v}\"")));
            ok.then(|| value.parse::<f64>().ok()).flatten()
        })
        .fold(0.0, |a, b| a + b)
}

/// CPU seconds (user + system) a process has used, from /proc (for the benchmarks).
pub fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or(vec![], |(_, rest)| rest.split_whitespace().collect());
    // After the command: field 3 (state) is index 0; utime and stime are fields 14 and 15.
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(f64::NAN)
    };
    (ticks(11) + ticks(12)) / 100.0
}

/// VmRSS and VmHWM of a process, in MiB.
pub fn proc_status(pid: u32) -> (f64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let mib = |key: &str| {
        status
            .lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
            .map_or(f64::NAN, |kib| kib / 1024.0)
    };
    (mib("VmRSS:"), mib("VmHWM:"))
}

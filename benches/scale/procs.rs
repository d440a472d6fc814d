//! Processes: control planes, the controller, training-operator.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use serde::Serialize;

use crate::*;

/// A control plane started by tests/cluster/start.sh; stopped by stop.sh on drop.
pub(crate) struct ControlPlane {
    pub(crate) dir: PathBuf,
    pub(crate) kubeconfig: PathBuf,
    pub(crate) bin: PathBuf,
    pub(crate) stopped: bool,
}

impl ControlPlane {
    pub(crate) fn start(dir: PathBuf) -> Res<Self> {
        std::fs::create_dir_all(&dir)?;
        let log_path = dir.join("start.log");
        let logf = std::fs::File::create(&log_path)?;
        log!("starting a control plane in {}", dir.display());
        let status = tokio::task::block_in_place(|| {
            Command::new(root().join("tests/cluster/start.sh"))
                .arg(&dir)
                .arg("--owner-pid")
                .arg(std::process::id().to_string())
                .stdin(Stdio::null())
                .stdout(logf.try_clone()?)
                .stderr(logf)
                .status()
        })?;
        if !status.success() {
            let tail = std::fs::read_to_string(&log_path).unwrap_or_default();
            let tail: Vec<&str> = tail.lines().rev().take(30).collect();
            return Err(err(format!(
                "start.sh {} failed ({status}):\n{}",
                dir.display(),
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            )));
        }
        let bin = sh(&format!(
            "source '{}' && printf %s \"$BIN\"",
            dir.join("env").display()
        ));
        if bin.is_empty() {
            return Err(err(format!("no BIN in {}/env", dir.display())));
        }
        Ok(ControlPlane {
            kubeconfig: dir.join("kubeconfig"),
            dir,
            bin: PathBuf::from(bin),
            stopped: false,
        })
    }

    /// CPU seconds (user + system) the control plane's process `comm` (`kube-apiserver`,
    /// `etcd`) has used so far, found through start.sh's `pids`.
    pub(crate) fn cpu_of(&self, comm: &str) -> Option<f64> {
        let pids = std::fs::read_to_string(self.dir.join("pids")).ok()?;
        let pid = pids
            .lines()
            .filter_map(|l| l.trim().parse::<u32>().ok())
            .find(|pid| {
                std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == comm)
            })?;
        proc_stats(pid).map(|s| s.cpu_s)
    }

    pub(crate) async fn client(&self) -> Res<Client> {
        let kc = Kubeconfig::read_from(&self.kubeconfig)?;
        let mut config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
        config.read_timeout = Some(Duration::from_secs(120));
        Ok(Client::try_from(config)?)
    }

    pub(crate) fn stop(&mut self) {
        if self.stopped {
            return;
        }
        self.stopped = true;
        log!("stopping the control plane in {}", self.dir.display());
        let _ = tokio::task::block_in_place(|| {
            Command::new(root().join("tests/cluster/stop.sh"))
                .arg(&self.dir)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
        });
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        self.stop();
    }
}

#[derive(Debug, Clone, Copy, Default, Serialize)]
pub(crate) struct ProcStats {
    pub(crate) rss_mib: f64,
    pub(crate) hwm_mib: f64,
    pub(crate) cpu_s: f64,
}

pub(crate) fn clk_tck() -> f64 {
    static TCK: OnceLock<f64> = OnceLock::new();
    *TCK.get_or_init(|| sh("getconf CLK_TCK").parse().unwrap_or(100.0))
}

pub(crate) fn proc_stats(pid: u32) -> Option<ProcStats> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib = |key: &str| -> Option<f64> {
        status
            .lines()
            .find(|l| l.starts_with(key))?
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()
    };
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    // fields[0] is field 3 (state); utime and stime are fields 14 and 15.
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some(ProcStats {
        rss_mib: round(kib("VmRSS:")? / 1024.0, 1),
        hwm_mib: round(kib("VmHWM:")? / 1024.0, 1),
        cpu_s: round((utime + stime) / clk_tck(), 2),
    })
}

/// A child process, killed (SIGKILL) on drop and, through a detached tether, when this
/// benchmark exits in any way.
pub(crate) struct Proc {
    pub(crate) name: String,
    pub(crate) child: Child,
    pub(crate) log: PathBuf,
    pub(crate) spawned: Instant,
    pub(crate) http: Option<SocketAddr>,
}

impl Proc {
    pub(crate) fn spawn(
        name: &str,
        mut cmd: Command,
        log: PathBuf,
        http: Option<SocketAddr>,
    ) -> Res<Self> {
        let f = std::fs::File::create(&log)?;
        let spawned = Instant::now();
        let child = cmd
            .stdin(Stdio::null())
            .stdout(f.try_clone()?)
            .stderr(f)
            .spawn()
            .map_err(|e| err(format!("spawning {name}: {e}")))?;
        crate::support::controller::tether(child.id());
        Ok(Proc {
            name: name.into(),
            child,
            log,
            spawned,
            http,
        })
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    pub(crate) fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    pub(crate) fn stats(&self) -> ProcStats {
        proc_stats(self.pid()).unwrap_or_default()
    }

    pub(crate) fn get(&self, path: &str) -> Option<(u16, String)> {
        http_get(self.http?, path)
    }

    pub(crate) fn log_tail(&self, n: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// SIGTERM, wait up to `grace` for the exit (then SIGKILL); returns the time it took.
    pub(crate) fn terminate(&mut self, grace: Duration) -> Duration {
        let t = Instant::now();
        let _ = Command::new("kill")
            .args(["-TERM", &self.pid().to_string()])
            .status();
        while t.elapsed() < grace {
            if !self.alive() {
                return t.elapsed();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        log!(
            "{} did not exit within {grace:?} of SIGTERM; SIGKILL",
            self.name
        );
        let _ = self.child.kill();
        let _ = self.child.wait();
        t.elapsed()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if self.alive() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

pub(crate) use crate::support::controller::http_get;

pub(crate) use crate::support::controller::metric_sum;

pub(crate) fn spawn_controller(
    cli: &Cli,
    bin: &Path,
    cp: &ControlPlane,
    log: PathBuf,
) -> Res<Proc> {
    let addr: SocketAddr = format!("127.0.0.1:{}", free_port()?).parse()?;
    let mut cmd = Command::new(bin);
    if cli.floor {
        cmd.arg(crate::floor::SUBCOMMAND);
    }
    cmd.arg("--kubeconfig")
        .arg(&cp.kubeconfig)
        .arg("--http-addr")
        .arg(addr.to_string())
        .arg(format!("--concurrency={}", cli.concurrency))
        .args(&cli.controller_args)
        .env_remove("PODGROUP_SYNC_LOG");
    for kv in &cli.controller_env {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        cmd.env(k, v);
    }
    Proc::spawn("podgroup-sync", cmd, log, Some(addr))
}

/// Polls /readyz every 25 ms; the time from spawn to 200.
pub(crate) async fn wait_ready(p: &mut Proc, timeout: Duration) -> Res<Duration> {
    let deadline = Instant::now() + timeout;
    loop {
        if !p.alive() {
            return Err(err(format!("{} exited:\n{}", p.name, p.log_tail(30))));
        }
        let pp = &*p;
        if tokio::task::block_in_place(|| pp.get("/readyz")).is_some_and(|(c, _)| c == 200) {
            return Ok(p.spawned.elapsed());
        }
        if Instant::now() > deadline {
            return Err(err(format!(
                "{} not ready after {timeout:?}:\n{}",
                p.name,
                p.log_tail(30)
            )));
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

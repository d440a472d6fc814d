//! Logging, paths and small numeric helpers.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::*;

pub(crate) static START: OnceLock<Instant> = OnceLock::new();

pub(crate) fn log_line(msg: String) {
    let t = START.get_or_init(Instant::now).elapsed().as_secs_f64();
    eprintln!("[scale +{t:7.1}s] {msg}");
}

pub(crate) fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub(crate) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

pub(crate) fn free_port() -> Res<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

pub(crate) fn sh(cmd: &str) -> String {
    Command::new("bash")
        .args(["-c", cmd])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

pub(crate) fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

pub(crate) fn secs(d: Duration) -> f64 {
    (d.as_secs_f64() * 1000.0).round() / 1000.0
}

pub(crate) fn round(x: f64, digits: i32) -> f64 {
    let f = 10f64.powi(digits);
    (x * f).round() / f
}

/// Spearman's rank correlation of paired values (ranks by sort order; ties are rare for
/// timestamps and broken by position). 1 when `y` keeps the order of `x`.
pub(crate) fn spearman(pairs: &[(f64, f64)]) -> Option<f64> {
    let n = pairs.len();
    if n < 2 {
        return None;
    }
    let ranks = |key: &dyn Fn(&(f64, f64)) -> f64| {
        let mut idx: Vec<usize> = (0..n).collect();
        idx.sort_by(|a, b| key(&pairs[*a]).total_cmp(&key(&pairs[*b])));
        let mut r = vec![0.0; n];
        for (rank, i) in idx.into_iter().enumerate() {
            r[i] = rank as f64;
        }
        r
    };
    let (rx, ry) = (ranks(&|p| p.0), ranks(&|p| p.1));
    let d2: f64 = rx.iter().zip(&ry).map(|(a, b)| (a - b) * (a - b)).sum();
    let n = n as f64;
    Some(1.0 - 6.0 * d2 / (n * (n * n - 1.0)))
}

/// Nearest-rank percentile of sorted values.
pub(crate) fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Polls `f` every `every` until it is true or `timeout` passes; returns whether it became true.
pub(crate) async fn poll_until(
    timeout: Duration,
    every: Duration,
    mut f: impl FnMut() -> bool,
) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if f() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(every).await;
    }
}

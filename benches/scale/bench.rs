//! The benchmark state shared by its three contenders.

use std::path::PathBuf;
use std::time::Duration;

#[allow(unused_imports)]
use crate::*;

pub(crate) struct Bench {
    pub(crate) cli: Cli,
    pub(crate) out: PathBuf,
    pub(crate) controller_bin: PathBuf,
    pub(crate) failures: Vec<String>,
    pub(crate) notes: Vec<String>,
    pub(crate) phases: Vec<Phase>,
    pub(crate) to_status: String,
    pub(crate) to_flags: Vec<String>,
    /// `kube-apiserver --version` of the control planes.
    pub(crate) apiserver: String,
}

impl Bench {
    pub(crate) fn converge_timeout(&self) -> Duration {
        Duration::from_secs(
            self.cli
                .timeout
                .unwrap_or((self.cli.jobs as u64 / 10).max(180)),
        )
    }

    pub(crate) fn fail(&mut self, msg: String) {
        log!("FAIL: {msg}");
        self.failures.push(msg);
    }
}

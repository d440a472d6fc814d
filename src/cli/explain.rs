//! `podgroup-sync explain`: the PodGroup a job would get, offline or against a cluster.

use super::ExplainArgs;
use crate::backend::{BackendKind, BackendOptions};
use crate::client as api;
use crate::explain::{Explained, cluster, compare, explain_job, surroundings};
use std::path::PathBuf;
use std::time::Duration;

fn read_manifests(files: &[PathBuf]) -> Result<Vec<String>, String> {
    files
        .iter()
        .map(|f| {
            if f.as_os_str() == "-" {
                std::io::read_to_string(std::io::stdin())
            } else {
                std::fs::read_to_string(f)
            }
            .map_err(|e| format!("{}: {e}", f.display()))
        })
        .collect()
}

pub fn run_explain(mut args: ExplainArgs) -> std::process::ExitCode {
    if let Some(target) = args.target.take() {
        args.job = Some(target);
    }
    let result = if args.kubeconfig.is_some() || args.job.is_some() {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("tokio runtime")
            .block_on(explain_with_cluster(&args))
    } else {
        read_manifests(&args.files).and_then(|texts| {
            let (job, around) = surroundings::read(&texts).map_err(|e| e.to_string())?;
            explain_job(
                &job,
                &around,
                args.backend,
                None,
                &args.backend_args.options(),
            )
            .map(|e| e.text)
            .map_err(|e| e.to_string())
        })
    };
    match result {
        Ok(out) => {
            print!("{out}");
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("podgroup-sync explain: {e}");
            std::process::ExitCode::from(1)
        }
    }
}

/// A client for a one-off command: a 30-second deadline per request, no fence, no throttle.
pub(crate) async fn one_off_client(kubeconfig: Option<&PathBuf>) -> Result<kube::Client, String> {
    let deadlines = api::Deadlines {
        timeout: Duration::from_secs(30),
        fence: api::Fence::open(),
        throttle: api::Throttle::new(None),
    };
    super::run::client(kubeconfig, deadlines)
        .await
        .map_err(|e| format!("cannot reach the cluster: {e}"))
}

/// `explain --kubeconfig` / `--job`: the cluster's context, and for `--job` the comparison.
async fn explain_with_cluster(args: &ExplainArgs) -> Result<String, String> {
    let client = one_off_client(args.kubeconfig.as_ref()).await?;
    let opts = args.backend_args.options();
    if let Some(nn) = &args.job {
        let c = compared(&client, nn, args.backend, &opts, &args.annotation_key).await?;
        return Ok(format!("{}{}", c.explained.text, c.comparison));
    }
    let texts = read_manifests(&args.files)?;
    let (job, given) = surroundings::read(&texts).map_err(|e| e.to_string())?;
    let namespace = job
        .pointer("/metadata/namespace")
        .and_then(|v| v.as_str())
        .unwrap_or("default")
        .to_string();
    let mut around = cluster::surroundings(&client, &namespace)
        .await
        .map_err(|e| e.to_string())?;
    around.add_given(given);
    explain_job(&job, &around, args.backend, None, &opts)
        .map(|e| e.text)
        .map_err(|e| e.to_string())
}

/// A job in the cluster explained in its context and compared with its PodGroup.
pub(crate) struct Compared {
    pub explained: Explained,
    /// The cluster's PodGroup of the job's backend and name.
    pub actual: Option<serde_json::Value>,
    /// The comparison (`# ` lines).
    pub comparison: String,
}

/// `explain --job NAMESPACE/NAME`'s work, shared with `status`.
pub(crate) async fn compared(
    client: &kube::Client,
    nn: &str,
    backend: Option<BackendKind>,
    opts: &BackendOptions,
    annotation_key: &str,
) -> Result<Compared, String> {
    let (namespace, name) = nn
        .split_once('/')
        .ok_or_else(|| format!("{nn}: expected NAMESPACE/NAME"))?;
    let job = cluster::find_job(client, namespace, name)
        .await
        .map_err(|e| e.to_string())?;
    let around = cluster::surroundings(client, namespace)
        .await
        .map_err(|e| e.to_string())?;
    let explained = explain_job(&job, &around, backend, None, opts).map_err(|e| e.to_string())?;
    let pg_name = explained.object["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let actual = cluster::pod_group(client, explained.backend, namespace, &pg_name)
        .await
        .map_err(|e| e.to_string())?;
    // Against an existing PodGroup, its immutable fields (and Volcano queue) stay as they are.
    let explained = match actual.as_ref().and_then(|a| a.get("spec")) {
        Some(spec) => explain_job(&job, &around, Some(explained.backend), Some(spec), opts)
            .map_err(|e| e.to_string())?,
        None => explained,
    };
    let comparison = compare::compare(
        &explained,
        actual.as_ref(),
        around.namespace_annotations(namespace),
        annotation_key,
    );
    Ok(Compared {
        explained,
        actual,
        comparison,
    })
}

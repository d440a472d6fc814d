//! `podgroup-sync explain`: the PodGroup a job would get, offline or against a cluster.

use super::ExplainArgs;
use crate::client as api;
use crate::explain::{Surroundings, cluster, compare, explain_job, surroundings};
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

pub fn run_explain(args: ExplainArgs) -> std::process::ExitCode {
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

/// `explain --kubeconfig` / `--job`: the cluster's context, and for `--job` the comparison.
async fn explain_with_cluster(args: &ExplainArgs) -> Result<String, String> {
    let deadlines = api::Deadlines {
        timeout: Duration::from_secs(30),
        fence: api::Fence::open(),
        throttle: api::Throttle::new(None),
    };
    let client = super::run::client(args.kubeconfig.as_ref(), deadlines)
        .await
        .map_err(|e| format!("cannot reach the cluster: {e}"))?;
    let opts = args.backend_args.options();
    let (job, given) = match &args.job {
        Some(nn) => {
            let (ns, name) = nn
                .split_once('/')
                .ok_or_else(|| format!("--job {nn}: expected NAMESPACE/NAME"))?;
            let job = cluster::find_job(&client, ns, name)
                .await
                .map_err(|e| e.to_string())?;
            (job, Surroundings::default())
        }
        None => {
            let texts = read_manifests(&args.files)?;
            surroundings::read(&texts).map_err(|e| e.to_string())?
        }
    };
    let namespace = job
        .pointer("/metadata/namespace")
        .and_then(|v| v.as_str())
        .unwrap_or("default")
        .to_string();
    let mut around = cluster::surroundings(&client, &namespace)
        .await
        .map_err(|e| e.to_string())?;
    around.add_given(given);
    let explained =
        explain_job(&job, &around, args.backend, None, &opts).map_err(|e| e.to_string())?;
    if args.job.is_none() {
        return Ok(explained.text);
    }
    let name = explained.object["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let actual = cluster::pod_group(&client, explained.backend, &namespace, &name)
        .await
        .map_err(|e| e.to_string())?;
    // Against an existing PodGroup, its immutable fields (and Volcano queue) stay as they are.
    let explained = match actual.as_ref().and_then(|a| a.get("spec")) {
        Some(spec) => explain_job(&job, &around, Some(explained.backend), Some(spec), &opts)
            .map_err(|e| e.to_string())?,
        None => explained,
    };
    let comparison = compare::compare(
        &explained,
        actual.as_ref(),
        around.namespace_annotations(&namespace),
        &args.annotation_key,
    );
    Ok(format!("{}{comparison}", explained.text))
}

//! The Helm chart as the tests use it: helm (built from its Go module by
//! `tests/cluster/get-helm.sh` on first use) and a release installed into a test control plane,
//! with a kubeconfig for its ServiceAccount.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

use serde_json::{Value, json};

use super::Cluster;

pub fn chart_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("chart/podgroup-sync")
}

/// The helm binary, built (once per machine) by get-helm.sh. Panics if it cannot be had.
pub fn helm() -> &'static Path {
    static HELM: OnceLock<PathBuf> = OnceLock::new();
    HELM.get_or_init(|| {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/cluster/get-helm.sh");
        let out = Command::new(&script)
            .stdin(Stdio::null())
            .stderr(Stdio::inherit())
            .output()
            .unwrap_or_else(|e| panic!("running {}: {e}", script.display()));
        let stdout = String::from_utf8_lossy(&out.stdout);
        match stdout
            .lines()
            .filter_map(|l| l.strip_prefix("HELM="))
            .next_back()
        {
            Some(helm) if out.status.success() => PathBuf::from(helm),
            _ => panic!("{} failed ({}):\n{stdout}", script.display(), out.status),
        }
    })
}

pub fn run_helm<S: AsRef<OsStr>>(args: &[S]) -> Output {
    Command::new(helm())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run helm")
}

/// helm's stderr without its notice that files/ is a symbolic link (to dashboards/).
pub fn helm_stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr)
        .lines()
        .filter(|l| !l.contains("found symbolic link in path"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// A release installed into the test control plane, in its own namespace.
pub struct Release {
    pub name: String,
    pub namespace: String,
    pub service_account: String,
    pub cluster_role: String,
    pub role: String,
    /// The controller arguments of the installed Deployment, minus `run`, `--http-addr` and
    /// `--discovery-interval-seconds` (the tests choose those).
    pub args: Vec<String>,
    /// A kubeconfig that authenticates as the release's ServiceAccount.
    pub kubeconfig: PathBuf,
    /// What `helm install` printed (NOTES.txt).
    pub install_output: String,
}

pub fn install(cluster: &Cluster, namespace: &str) -> Release {
    install_with(cluster, namespace, &[])
}

/// [`install`] with `--set` values (e.g. an installation identity of its own).
pub fn install_with(cluster: &Cluster, namespace: &str, sets: &[&str]) -> Release {
    let name = namespace.to_string();
    let chart = chart_dir();
    let mut helm_args = vec![
        OsStr::new("install"),
        OsStr::new(&name),
        chart.as_os_str(),
        OsStr::new("--namespace"),
        OsStr::new(namespace),
        OsStr::new("--kubeconfig"),
        cluster.kubeconfig.as_os_str(),
        // No kubelet runs the pod; the objects are what is tested.
        OsStr::new("--wait=false"),
        OsStr::new("--timeout=120s"),
    ];
    for set in sets {
        helm_args.push(OsStr::new("--set"));
        helm_args.push(OsStr::new(set));
    }
    let out = run_helm(&helm_args);
    assert!(
        out.status.success(),
        "helm install failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        helm_stderr(&out)
    );
    let fullname = format!("{name}-podgroup-sync");
    let deployment: Value = serde_json::from_str(&cluster.kubectl_ok(&[
        "get",
        "deployment",
        &fullname,
        "-n",
        namespace,
        "-o",
        "json",
    ]))
    .expect("deployment JSON");
    let spec = &deployment["spec"]["template"]["spec"];
    let service_account = spec["serviceAccountName"].as_str().unwrap().to_string();
    let args = spec["containers"][0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .filter(|a| {
            a != "run"
                && !a.starts_with("--http-addr=")
                && !a.starts_with("--discovery-interval-seconds=")
                && !a.starts_with("--webhook-addr=")
        })
        // Tests run several releases' controllers at once: any free port for the webhook.
        .chain(["--webhook-addr=127.0.0.1:0".to_string()])
        .collect();

    let token = cluster.kubectl_ok(&[
        "create",
        "token",
        &service_account,
        "-n",
        namespace,
        "--duration=2h",
    ]);
    let kubeconfig = token_kubeconfig(cluster, namespace, token.trim());
    Release {
        name,
        namespace: namespace.to_string(),
        service_account,
        cluster_role: fullname.clone(),
        role: format!("{fullname}-leader-election"),
        args,
        kubeconfig,
        install_output: String::from_utf8_lossy(&out.stdout).into_owned(),
    }
}

/// A kubeconfig with the admin kubeconfig's server and CA, and `token` as the credential.
pub fn token_kubeconfig(cluster: &Cluster, namespace: &str, token: &str) -> PathBuf {
    let admin: Value = serde_yaml_ng::from_str(
        &std::fs::read_to_string(&cluster.kubeconfig).expect("admin kubeconfig"),
    )
    .expect("kubeconfig YAML");
    let kc = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "test", "cluster": admin["clusters"][0]["cluster"].clone()}],
        "users": [{"name": "sa", "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "test", "user": "sa", "namespace": namespace}}],
        "current-context": "sa",
    });
    let dir = cluster
        .work_dir
        .clone()
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_TARGET_TMPDIR")));
    let path = dir.join(format!("kubeconfig-{namespace}-sa"));
    std::fs::write(&path, serde_yaml_ng::to_string(&kc).unwrap()).expect("write kubeconfig");
    path
}

impl Release {
    pub fn uninstall(&self, cluster: &Cluster) {
        let _ = run_helm(&[
            OsStr::new("uninstall"),
            OsStr::new(&self.name),
            OsStr::new("--namespace"),
            OsStr::new(&self.namespace),
            OsStr::new("--kubeconfig"),
            cluster.kubeconfig.as_os_str(),
        ]);
    }

    pub fn args(&self) -> Vec<&str> {
        self.args.iter().map(String::as_str).collect()
    }

    /// The value of a `--flag=value` argument of the installed Deployment.
    pub fn arg(&self, flag: &str) -> Option<&str> {
        let prefix = format!("{flag}=");
        self.args
            .iter()
            .find_map(|a| a.strip_prefix(prefix.as_str()))
    }

    /// `kubectl auth can-i` as the release's ServiceAccount, with its own token.
    pub fn can_i(&self, cluster: &Cluster, verb: &str, resource: &str, ns: Option<&str>) -> bool {
        let mut args = vec![
            format!("--kubeconfig={}", self.kubeconfig.display()),
            "auth".into(),
            "can-i".into(),
            verb.into(),
            resource.into(),
        ];
        match ns {
            Some(ns) => args.extend(["-n".into(), ns.into()]),
            None => args.push("--all-namespaces".into()),
        }
        let out = Command::new(cluster.bin_dir.join("kubectl"))
            .args(&args)
            .stdin(Stdio::null())
            .output()
            .expect("kubectl auth can-i");
        String::from_utf8_lossy(&out.stdout).trim() == "yes"
    }
}

//! Contender 3: training-operator v1.9 with its own gang scheduling (scheduler-plugins).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::Api;
use kube::api::{DynamicObject, ObjectMeta, PostParams};
use serde_json::{Value, json};

use crate::*;

impl Bench {
    /// Finds training-operator: $TRAINING_OPERATOR, else tests/e2e/get-e2e-binaries.sh (which
    /// builds it when needed, or waits for another run building it), bounded in time.
    pub(crate) fn find_training_operator(&self) -> Result<PathBuf, String> {
        if let Some(p) = std::env::var_os("TRAINING_OPERATOR").filter(|p| !p.is_empty()) {
            return Ok(PathBuf::from(p));
        }
        // A complete build in the cache (the script's `.done` marker) is used as is: the script
        // itself would first wait for any other get-e2e-binaries.sh run on the machine.
        let cache = std::env::var_os("PGS_CACHE")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(sh("echo $HOME")).join(".cache/podgroup-sync"));
        let mut built: Vec<PathBuf> = std::fs::read_dir(cache.join("bin"))
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|d| {
                d.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("training-operator-v1.9."))
                    && d.join(".done").is_file()
                    && d.join("training-operator.v1").is_file()
            })
            .collect();
        built.sort();
        if let Some(d) = built.pop() {
            return Ok(d.join("training-operator.v1"));
        }
        use std::os::unix::process::CommandExt;
        let script = root().join("tests/e2e/get-e2e-binaries.sh");
        let log_path = self.out.join("get-e2e-binaries.log");
        let logf = std::fs::File::create(&log_path).map_err(|e| e.to_string())?;
        let out_path = self.out.join("get-e2e-binaries.out");
        let outf = std::fs::File::create(&out_path).map_err(|e| e.to_string())?;
        log!(
            "locating training-operator with {} (may build it; at most {} s)",
            script.display(),
            self.cli.to_build_timeout
        );
        let mut child = Command::new(&script)
            .arg("training-operator")
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(outf)
            .stderr(logf)
            .spawn()
            .map_err(|e| format!("running {}: {e}", script.display()))?;
        let deadline = Instant::now() + Duration::from_secs(self.cli.to_build_timeout);
        let status = loop {
            if let Ok(Some(s)) = child.try_wait() {
                break s;
            }
            if Instant::now() > deadline {
                let _ = Command::new("kill")
                    .args(["-TERM", "--", &format!("-{}", child.id())])
                    .status();
                let _ = child.wait();
                return Err(format!(
                    "get-e2e-binaries.sh training-operator did not finish within {} s (log: {})",
                    self.cli.to_build_timeout,
                    log_path.display()
                ));
            }
            std::thread::sleep(Duration::from_millis(500));
        };
        let out = std::fs::read_to_string(&out_path).unwrap_or_default();
        match out
            .lines()
            .filter_map(|l| l.strip_prefix("TRAINING_OPERATOR="))
            .next_back()
        {
            Some(p) if status.success() && Path::new(p).is_file() => Ok(PathBuf::from(p)),
            _ => Err(format!(
                "get-e2e-binaries.sh training-operator failed ({status}); log: {}",
                log_path.display()
            )),
        }
    }

    /// Phase 3: training-operator v1.9 with gang scheduling on (scheduler-plugins).
    pub(crate) async fn training_operator(&mut self) -> Res<()> {
        let (n, m) = (self.cli.jobs, self.cli.namespaces);
        let bin = match tokio::task::block_in_place(|| self.find_training_operator()) {
            Ok(b) => b,
            Err(why) => {
                self.to_status = format!("not measured: {why}");
                log!("training-operator {}", self.to_status);
                return Ok(());
            }
        };
        let mut cp = ControlPlane::start(self.out.join("cp-training-operator"))?;
        let client = cp.client().await?;
        let tmp = self.webhook_certs(&client).await?;
        let Some((mut to, ready, workers_s)) =
            self.spawn_training_operator(&bin, &cp, &tmp).await?
        else {
            return Ok(());
        };
        create_namespaces(&client, "to", m, &[]).await?;
        let watch = PgWatch::start(&client).await?;
        let check = Check::MinMember(4);
        let w = Window::open("training-operator-burst", n, &client, &watch, "to-", &check).await?;
        let cpu0 = to.stats().cpu_s;
        let posts = AtomicU64::new(0);
        let t0 = w.t0;
        let created = create_jobs(&client, "to", n, m, self.cli.creators, None, &posts).await?;
        log!(
            "training-operator, burst: {n} jobs created in {:.1} s; waiting for PodGroups",
            t0.elapsed().as_secs_f64()
        );
        let to_timeout = Duration::from_secs(
            self.cli
                .to_timeout
                .unwrap_or(((n as f64 * 0.3) as u64).max(300)),
        );
        let mut last_log = Instant::now();
        let deadline = Instant::now() + to_timeout;
        while watch.correct_count() < n && Instant::now() < deadline && to.alive() {
            if last_log.elapsed() > Duration::from_secs(15) {
                log!(
                    "training-operator: {} of {n} PodGroups after {:.0} s",
                    watch.correct_count(),
                    t0.elapsed().as_secs_f64()
                );
                last_log = Instant::now();
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let posts = posts.load(Ordering::Relaxed) as f64;
        let mut p = w.close(&client, &created, &watch, false, posts).await?;
        let stats_pg = to.stats();
        p.process = Some(stats_pg);
        p.cpu_s = Some(round(stats_pg.cpu_s - cpu0, 2));
        p.extra.insert("ready_s".into(), json!(secs(ready)));
        p.extra
            .insert("workers_started_s".into(), json!(secs(workers_s)));
        log!(
            "training-operator: {} of {n} PodGroups, converge {:?} s; now waiting for its pods and services",
            p.correct,
            p.converge_s
        );

        let (done_at, stats) = self.full_cost(&client, &w, &mut to, &mut p, cpu0).await?;
        p.extra.insert("sample_podgroup_spec".into(), {
            let api: Api<DynamicObject> =
                Api::namespaced_with(client.clone(), "to-0", &podgroup_ar());
            api.get_opt("pj-00000")
                .await
                .ok()
                .flatten()
                .map(|pg| pg.data["spec"].clone())
                .unwrap_or(Value::Null)
        });
        self.to_status = if p.converged {
            "measured".into()
        } else {
            format!(
                "measured, but only {} of {n} PodGroups within {to_timeout:?}",
                p.correct
            )
        };
        log!(
            "training-operator: all pods and services at {:?}; peak RSS {} MiB",
            done_at,
            stats.hwm_mib
        );
        self.phases.push(p);
        tokio::task::block_in_place(|| to.terminate(Duration::from_secs(30)));
        drop(watch);
        cp.stop();
        Ok(())
    }

    /// training-operator's certificate rotator waits for the webhook Secret and a serving
    /// certificate; returns the TMPDIR its webhook server loads the certificate from.
    async fn webhook_certs(&self, client: &kube::Client) -> Res<PathBuf> {
        // Its certificate rotator waits for the webhook Secret (namespace $MY_POD_NAMESPACE) and
        // for /tmp/k8s-webhook-server/serving-certs/tls.crt (a constant path it only checks
        // exists); its webhook server loads the certificate from $TMPDIR. No
        // ValidatingWebhookConfiguration exists, so the API server never calls the webhook.
        let nsapi: Api<Namespace> = Api::all(client.clone());
        let kubeflow = Namespace {
            metadata: ObjectMeta {
                name: Some("kubeflow".into()),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        };
        nsapi.create(&PostParams::default(), &kubeflow).await?;
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some("training-operator-webhook-cert".into()),
                ..ObjectMeta::default()
            },
            ..Secret::default()
        };
        Api::<Secret>::namespaced(client.clone(), "kubeflow")
            .create(&PostParams::default(), &secret)
            .await?;
        let tmp = self.out.join("training-operator-tmp");
        let certs = tmp.join("k8s-webhook-server/serving-certs");
        std::fs::create_dir_all(&certs)?;
        let openssl = Command::new("openssl")
            .args([
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-nodes",
                "-days",
                "7",
            ])
            .args([
                "-subj",
                "/CN=training-operator.kubeflow.svc",
                "-addext",
                "subjectAltName=DNS:training-operator.kubeflow.svc",
            ])
            .arg("-keyout")
            .arg(certs.join("tls.key"))
            .arg("-out")
            .arg(certs.join("tls.crt"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()?;
        if !openssl.success() {
            return Err(err("openssl failed"));
        }
        let global = Path::new("/tmp/k8s-webhook-server/serving-certs");
        if !global.join("tls.crt").exists() {
            std::fs::create_dir_all(global)?;
            let tmpf = global.join(format!(".tls.crt.{}", std::process::id()));
            std::fs::copy(certs.join("tls.crt"), &tmpf)?;
            if !global.join("tls.crt").exists() {
                std::fs::rename(&tmpf, global.join("tls.crt"))?;
            } else {
                let _ = std::fs::remove_file(&tmpf);
            }
        }
        Ok(tmp)
    }

    /// Starts training-operator and waits for its workers; `None` (with the status said) when
    /// they never start. Returns the process, its time to ready and to its workers.
    async fn spawn_training_operator(
        &mut self,
        bin: &Path,
        cp: &ControlPlane,
        tmp: &Path,
    ) -> Res<Option<(Proc, Duration, Duration)>> {
        let (p_metrics, p_probe, p_webhook) = (free_port()?, free_port()?, free_port()?);
        let threads = self.cli.to_threads.unwrap_or(self.cli.concurrency);
        self.to_flags = vec![
            "--gang-scheduler-name=scheduler-plugins".into(),
            "--enable-scheme=pytorchjob".into(),
            "--leader-elect=false".into(),
        ];
        if !self.cli.to_upstream_defaults {
            self.to_flags
                .push(format!("--controller-threads={threads}"));
            self.to_flags
                .push(format!("--kube-api-qps={}", self.cli.to_qps));
            self.to_flags
                .push(format!("--kube-api-burst={}", self.cli.to_burst));
        }
        let mut cmd = Command::new(bin);
        cmd.env_remove("KUBECONFIG")
            .env("TMPDIR", tmp)
            .env("MY_POD_NAMESPACE", "kubeflow")
            .arg(format!("--kubeconfig={}", cp.kubeconfig.display()))
            .arg(format!("--metrics-bind-address=127.0.0.1:{p_metrics}"))
            .arg(format!("--health-probe-bind-address=127.0.0.1:{p_probe}"))
            .arg(format!("--webhook-server-port={p_webhook}"))
            .args(&self.to_flags);
        let probe: SocketAddr = format!("127.0.0.1:{p_probe}").parse()?;
        let mut to = Proc::spawn(
            "training-operator",
            cmd,
            self.out.join("training-operator.log"),
            Some(probe),
        )?;
        let ready = wait_ready(&mut to, Duration::from_secs(180)).await?;
        // Controllers start only after the certificates are ready.
        let log_path = to.log.clone();
        let started = poll_until(Duration::from_secs(180), Duration::from_millis(200), || {
            std::fs::read_to_string(&log_path).is_ok_and(|l| l.contains("Starting workers"))
        })
        .await;
        if !started {
            self.to_status = format!(
                "not measured: training-operator never started its workers:\n{}",
                to.log_tail(20)
            );
            return Ok(None);
        }
        let workers_s = to.spawned.elapsed();
        log!(
            "training-operator ready in {:.1} s, workers started at {:.1} s (flags {:?})",
            ready.as_secs_f64(),
            workers_s.as_secs_f64(),
            self.to_flags
        );

        Ok(Some((to, ready, workers_s)))
    }

    /// Its full cost beyond the PodGroups: until it created 4 pods and 4 services per job (or
    /// stopped writing). Returns when it was done, and its process figures at the end.
    async fn full_cost(
        &self,
        client: &kube::Client,
        w: &Window,
        to: &mut Proc,
        p: &mut Phase,
        cpu0: f64,
    ) -> Res<(Option<Duration>, ProcStats)> {
        let n = self.cli.jobs;
        let mut last_log = Instant::now();
        // Its full cost: until it created 4 pods and 4 services per job (or stopped writing).
        let settle_deadline = Instant::now() + Duration::from_secs(self.cli.to_settle_timeout);
        let (mut last_total, mut last_change) = (0.0, Instant::now());
        let mut done_at = None;
        while Instant::now() < settle_deadline && to.alive() {
            let d = w.since(&Requests::scrape(client).await?);
            let pods = d.sum(|v, r, c| v == "POST" && r == "pods" && c == "201");
            let svcs = d.sum(|v, r, c| v == "POST" && r == "services" && c == "201");
            if pods >= 4.0 * n as f64 && svcs >= 4.0 * n as f64 {
                done_at = Some(w.t0.elapsed());
                break;
            }
            let total = d.without_scrapes().total();
            if total != last_total {
                (last_total, last_change) = (total, Instant::now());
            } else if last_change.elapsed() > Duration::from_secs(30) {
                break;
            }
            if last_log.elapsed() > Duration::from_secs(15) {
                log!(
                    "training-operator: {pods} pods, {svcs} services created after {:.0} s",
                    w.t0.elapsed().as_secs_f64()
                );
                last_log = Instant::now();
            }
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        let after = Requests::scrape(client).await?;
        let stats = to.stats();
        let d = w.since(&after).without_scrapes();
        let full_total = d.total() - p.bench_requests;
        p.extra.insert(
            "pods_created".into(),
            json!(d.sum(|v, r, c| v == "POST" && r == "pods" && c == "201")),
        );
        p.extra.insert(
            "services_created".into(),
            json!(d.sum(|v, r, c| v == "POST" && r == "services" && c == "201")),
        );
        p.extra
            .insert("all_pods_and_services_s".into(), json!(done_at.map(secs)));
        p.extra.insert(
            "full_requests_per_job".into(),
            json!(round(full_total / n as f64, 3)),
        );
        p.extra.insert(
            "full_writes_per_job".into(),
            json!(round((d.writes() - p.bench_requests) / n as f64, 3)),
        );
        p.extra
            .insert("full_requests".into(), json!(d.by_verb_resource()));
        p.extra.insert("process_at_end".into(), json!(stats));
        p.extra
            .insert("cpu_s_at_end".into(), json!(round(stats.cpu_s - cpu0, 2)));
        Ok((done_at, stats))
    }
}

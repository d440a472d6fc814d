#!/usr/bin/env python3
"""differential.py OLD_BIN NEW_BIN [N] [SEED]: the same N random Kubeflow jobs explained by two
builds, for every backend, with and without a PriorityClass and a LimitRange around them; prints
the first difference and exits 1 if any output differs. Used to show that a refactoring of the
model left every PodGroup (and every line of the reasoning) as it was."""
import json, random, subprocess, sys, tempfile

old, new = sys.argv[1], sys.argv[2]
n = int(sys.argv[3]) if len(sys.argv) > 3 else 500
rnd = random.Random(int(sys.argv[4]) if len(sys.argv) > 4 else 1)
KINDS = [
    ("kubeflow.org/v1", "PyTorchJob", "pytorchReplicaSpecs", ["Master", "Worker"]),
    ("kubeflow.org/v1", "TFJob", "tfReplicaSpecs", ["PS", "Worker", "Chief", "Master", "Evaluator"]),
    ("kubeflow.org/v2beta1", "MPIJob", "mpiReplicaSpecs", ["Launcher", "Worker"]),
    ("kubeflow.org/v1", "MPIJob", "mpiReplicaSpecs", ["Launcher", "Worker"]),
    ("kubeflow.org/v1", "XGBoostJob", "xgbReplicaSpecs", ["Master", "Worker"]),
    ("kubeflow.org/v1", "PaddleJob", "paddleReplicaSpecs", ["Master", "Worker"]),
    ("kubeflow.org/v1", "JAXJob", "jaxReplicaSpecs", ["Worker"]),
]

def quantity():
    return rnd.choice(["1", "500m", "2", "0", "1.5", "100m", "3Gi", "1G", "129M", "0.1"])

def container(i):
    c = {"name": f"c{i}", "image": "x"}
    res = {}
    for part in ["requests", "limits"]:
        if rnd.random() < 0.6:
            res[part] = {r: quantity() for r in rnd.sample(["cpu", "memory", "nvidia.com/gpu"], rnd.randint(1, 3))}
    if res:
        c["resources"] = res
    return c

def template():
    spec = {"containers": [container(i) for i in range(rnd.randint(1, 2))]}
    if rnd.random() < 0.3:
        spec["initContainers"] = [container(9)]
        if rnd.random() < 0.5:
            spec["initContainers"][0]["restartPolicy"] = "Always"
    if rnd.random() < 0.3:
        spec["priorityClassName"] = rnd.choice(["high", "low", "missing"])
    if rnd.random() < 0.2:
        spec["schedulerName"] = rnd.choice(["volcano", "scheduler-plugins-scheduler", "default-scheduler"])
    t = {"spec": spec}
    if rnd.random() < 0.2:
        t["metadata"] = {"labels": {"scheduling.x-k8s.io/pod-group": rnd.choice(["j", "other"])}}
    if rnd.random() < 0.1:
        t.setdefault("metadata", {})["annotations"] = {"scheduling.k8s.io/group-name": "j", "volcano.sh/task-spec": "t"}
    return t

def job():
    api, kind, field, types = rnd.choice(KINDS)
    specs = {}
    for t in rnd.sample(types, rnd.randint(1, len(types))):
        s = {"template": template()}
        if rnd.random() < 0.8:
            s["replicas"] = rnd.choice([0, 1, 2, 3, 8])
        specs[rnd.choice([t, t.lower()])] = s
    spec = {field: specs}
    rp = {}
    if rnd.random() < 0.3:
        sp = {}
        if rnd.random() < 0.5: sp["minAvailable"] = rnd.choice([0, 1, 2, 5, 30])
        if rnd.random() < 0.3: sp["queue"] = "q"
        if rnd.random() < 0.2: sp["minResources"] = {"cpu": "3"}
        if rnd.random() < 0.3: sp["priorityClass"] = "high"
        if rnd.random() < 0.3: sp["scheduleTimeoutSeconds"] = rnd.choice([-1, 60])
        rp["schedulingPolicy"] = sp
    if rnd.random() < 0.1: rp["suspend"] = True
    if rp: spec["runPolicy"] = rp
    if kind in ("PyTorchJob", "PaddleJob") and rnd.random() < 0.4:
        ep = {}
        if rnd.random() < 0.6: ep["minReplicas"] = rnd.choice([0, 1, 2, 4, 9])
        if rnd.random() < 0.5: ep["maxReplicas"] = rnd.choice([2, 6])
        spec["elasticPolicy"] = ep
    if api.endswith("v2beta1") and rnd.random() < 0.5:
        spec["launcherCreationPolicy"] = "WaitForWorkersReady"
    ann = {}
    if rnd.random() < 0.2:
        ann["scheduling.volcano.sh/queue-name"] = "vq"
    return {"apiVersion": api, "kind": kind, "metadata": {"name": "j", "namespace": "n", "annotations": ann}, "spec": spec}

AROUND = [
    {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": "high"}, "value": 1000},
    {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": "low"}, "value": 10},
    {"apiVersion": "v1", "kind": "LimitRange", "metadata": {"name": "l", "namespace": "n"},
     "spec": {"limits": [{"type": "Container", "defaultRequest": {"cpu": "250m"}, "default": {"memory": "1Gi"}}]}},
]

def run(binary, path, backend):
    args = [binary, "explain", "-f", path] + (["--backend", backend] if backend else [])
    p = subprocess.run(args, capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr

diffs = 0
with tempfile.TemporaryDirectory() as d:
    for i in range(n):
        docs = [job()] + (AROUND if rnd.random() < 0.5 else [])
        path = f"{d}/job.yaml"
        with open(path, "w") as f:
            f.write("\n---\n".join(json.dumps(x) for x in docs))
        for backend in [None, "scheduler-plugins", "volcano", "kubernetes"]:
            a, b = run(old, path, backend), run(new, path, backend)
            if a != b:
                diffs += 1
                if diffs <= 3:
                    print(f"job {i} backend {backend}:\n{json.dumps(docs[0])}\n--- old ---\n{a}\n--- new ---\n{b}")
print(f"{n} jobs x 4 backends: {diffs} differences")
sys.exit(1 if diffs else 0)

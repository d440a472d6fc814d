#!/usr/bin/env python3
"""operator-webhooks.py OPERATOR PORT CA_FILE [MANIFEST]: the webhook configurations of the
JobSet, the LeaderWorkerSet or the Trainer v2 controller, or of Kueue (OPERATOR: jobset, lws,
trainer or kueue) as their upstream manifests register them
(failurePolicy Fail; the pod webhooks only for pods with the operator's name label), reached by
URL on loopback instead of a Service. Kueue's are read from its upstream MANIFEST and kept for
its own objects and the integrations the e2e tier enables. Prints a v1 List."""
import base64, json, sys

operator, port = sys.argv[1], sys.argv[2]
ca = base64.b64encode(open(sys.argv[3], "rb").read()).decode()


def hook(name, path, group, version, resource, ops, selector=None):
    h = {"name": name, "admissionReviewVersions": ["v1"], "sideEffects": "None",
         "failurePolicy": "Fail",
         "clientConfig": {"url": f"https://127.0.0.1:{port}{path}", "caBundle": ca},
         "rules": [{"apiGroups": [group], "apiVersions": [version], "operations": ops,
                    "resources": [resource]}]}
    if selector:
        h["objectSelector"] = {"matchExpressions": [{"key": selector, "operator": "Exists"}]}
    return h


def config(kind, hooks):
    return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": kind,
            "metadata": {"name": f"e2e-{operator}"}, "webhooks": hooks}


if operator == "jobset":
    LABEL = "jobset.sigs.k8s.io/jobset-name"
    JOBSETS = ("jobset.x-k8s.io", "v1alpha2", "jobsets")
    mutating = [
        hook("mjobset.kb.io", "/mutate-jobset-x-k8s-io-v1alpha2-jobset", *JOBSETS, ["CREATE"]),
        hook("mpod.kb.io", "/mutate--v1-pod", "", "v1", "pods", ["CREATE"], LABEL)]
    validating = [
        hook("vjobset.kb.io", "/validate-jobset-x-k8s-io-v1alpha2-jobset", *JOBSETS,
             ["CREATE", "UPDATE"]),
        hook("vpod.kb.io", "/validate--v1-pod", "", "v1", "pods", ["CREATE"], LABEL)]
elif operator == "lws":
    LABEL = "leaderworkerset.sigs.k8s.io/name"
    LWS = ("leaderworkerset.x-k8s.io", "v1", "leaderworkersets")
    DS = ("disaggregatedset.x-k8s.io", "v1", "disaggregatedsets")
    mutating = [
        hook("mleaderworkerset.kb.io", "/mutate-leaderworkerset-x-k8s-io-v1-leaderworkerset",
             *LWS, ["CREATE", "UPDATE"]),
        hook("mpod.kb.io", "/mutate--v1-pod", "", "v1", "pods", ["CREATE"], LABEL)]
    validating = [
        hook("vleaderworkerset.kb.io", "/validate-leaderworkerset-x-k8s-io-v1-leaderworkerset",
             *LWS, ["CREATE", "UPDATE"]),
        hook("vpod.kb.io", "/validate--v1-pod", "", "v1", "pods", ["CREATE", "UPDATE"], LABEL),
        hook("vdisaggregatedset.kb.io", "/validate-disaggregatedset-x-k8s-io-v1-disaggregatedset",
             *DS, ["CREATE", "UPDATE"])]
elif operator == "trainer":
    G, V = "trainer.kubeflow.org", "v1alpha1"
    mutating = [
        hook("defaulter.trainjob.trainer.kubeflow.org",
             "/mutate-trainer-kubeflow-org-v1alpha1-trainjob", G, V, "trainjobs",
             ["CREATE", "UPDATE"])]
    validating = [
        hook(f"validator.{r[:-1]}.trainer.kubeflow.org",
             f"/validate-trainer-kubeflow-org-v1alpha1-{r[:-1]}", G, V, r, ["CREATE", "UPDATE"])
        for r in ("clustertrainingruntimes", "trainingruntimes", "trainjobs")]
elif operator == "kueue":
    import yaml
    # The e2e configuration's integrations (tests/e2e/start.sh) and Kueue's own kinds.
    KEEP = ("-batch-v1-job", "-kubeflow-org-v1-pytorchjob", "-jobset-x-k8s-io-v1alpha2-jobset",
            "-ray-io-v1-rayjob", "-kueue-x-k8s-io-")
    mutating, validating = [], []
    for doc in yaml.safe_load_all(open(sys.argv[4])):
        if not doc:
            continue
        for h in doc["webhooks"]:
            path = h["clientConfig"]["service"]["path"]
            if not any(k in path for k in KEEP):
                continue
            h["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}", "caBundle": ca}
            # Upstream's kustomization keeps them off kube-system and kueue-system.
            h["namespaceSelector"] = {"matchExpressions": [
                {"key": "kubernetes.io/metadata.name", "operator": "NotIn",
                 "values": ["kube-system", "kueue-system"]}]}
            (mutating if doc["kind"] == "MutatingWebhookConfiguration" else validating).append(h)
else:
    sys.exit(f"operator-webhooks.py: unknown operator {operator}")

print(json.dumps({"apiVersion": "v1", "kind": "List", "items": [
    config("MutatingWebhookConfiguration", mutating),
    config("ValidatingWebhookConfiguration", validating)]}))

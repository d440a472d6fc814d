#!/usr/bin/env python3
"""operator-webhooks.py PORT CA_FILE: the JobSet controller's webhook configurations as its
upstream manifests register them (failurePolicy Fail; the pod webhooks only for pods with the
JobSet's name label), reached by URL on loopback instead of a Service. Prints a v1 List."""
import base64, json, sys

port, ca = sys.argv[1], base64.b64encode(open(sys.argv[2], "rb").read()).decode()
LABEL = "jobset.sigs.k8s.io/jobset-name"


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
            "metadata": {"name": "e2e-jobset"}, "webhooks": hooks}


JOBSETS = ("jobset.x-k8s.io", "v1alpha2", "jobsets")
print(json.dumps({"apiVersion": "v1", "kind": "List", "items": [
    config("MutatingWebhookConfiguration", [
        hook("mjobset.kb.io", "/mutate-jobset-x-k8s-io-v1alpha2-jobset", *JOBSETS, ["CREATE"]),
        hook("mpod.kb.io", "/mutate--v1-pod", "", "v1", "pods", ["CREATE"], LABEL)]),
    config("ValidatingWebhookConfiguration", [
        hook("vjobset.kb.io", "/validate-jobset-x-k8s-io-v1alpha2-jobset", *JOBSETS,
             ["CREATE", "UPDATE"]),
        hook("vpod.kb.io", "/validate--v1-pod", "", "v1", "pods", ["CREATE"], LABEL)])]}))

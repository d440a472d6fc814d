#!/usr/bin/env python3
"""The SBOM of the podgroup-sync binary: an SPDX 2.3 JSON document listing every crate compiled
into it for the given targets (the crate's normal dependencies, transitively, as `cargo metadata
--locked` resolves them per target; build scripts' and tests' dependencies are not in the binary
and are left out), each with its version, licence, crates.io checksum from Cargo.lock and a
`pkg:cargo` package URL. Deterministic: the same Cargo.lock gives the same document (its
`created` time is fixed, its namespace derived from the content).

usage: hack/sbom.py --name NAME [--target TRIPLE ...]   (the document on stdout)
"""
import argparse
import hashlib
import json
import subprocess
import sys
import tomllib


def metadata(target):
    cmd = ["cargo", "metadata", "--locked", "--format-version", "1"]
    if target:
        cmd += ["--filter-platform", target]
    return json.loads(subprocess.run(cmd, check=True, capture_output=True).stdout)


def shipped(meta):
    """The package ids reachable from the root through normal (non-build, non-dev) edges."""
    nodes = {n["id"]: n for n in meta["resolve"]["nodes"]}
    root = meta["resolve"]["root"]
    seen, todo = {root}, [root]
    while todo:
        for dep in nodes[todo.pop()]["deps"]:
            if any(k["kind"] is None for k in dep["dep_kinds"]) and dep["pkg"] not in seen:
                seen.add(dep["pkg"])
                todo.append(dep["pkg"])
    return seen, root


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--name", required=True)
    ap.add_argument("--target", action="append", default=[])
    args = ap.parse_args()
    packages, root = {}, None
    for target in args.target or [None]:
        meta = metadata(target)
        ids, root = shipped(meta)
        for p in meta["packages"]:
            if p["id"] in ids:
                packages[p["id"]] = p
        workspace = meta["workspace_root"]
    with open(f"{workspace}/Cargo.lock", "rb") as f:
        lock = tomllib.load(f)
    checksums = {(p["name"], p["version"]): p.get("checksum") for p in lock["package"]}

    def spdx_id(p):
        return "SPDXRef-Package-" + "".join(
            c if c.isalnum() or c in ".-" else "-" for c in f"{p['name']}-{p['version']}")

    out = []
    for pid in sorted(packages, key=lambda i: (packages[i]["name"], packages[i]["version"])):
        p = packages[pid]
        from_registry = (p.get("source") or "").startswith("registry+")
        entry = {
            "SPDXID": spdx_id(p),
            "name": p["name"],
            "versionInfo": p["version"],
            "downloadLocation": (
                f"https://crates.io/api/v1/crates/{p['name']}/{p['version']}/download"
                if from_registry else "NOASSERTION"),
            "licenseConcluded": "NOASSERTION",
            "licenseDeclared": p.get("license") or "NOASSERTION",
            "copyrightText": "NOASSERTION",
            "filesAnalyzed": False,
            "externalRefs": [{
                "referenceCategory": "PACKAGE-MANAGER",
                "referenceType": "purl",
                "referenceLocator": f"pkg:cargo/{p['name']}@{p['version']}",
            }],
        }
        if p.get("repository"):
            entry["homepage"] = p["repository"]
        checksum = checksums.get((p["name"], p["version"]))
        if checksum:
            entry["checksums"] = [{"algorithm": "SHA256", "checksumValue": checksum}]
        out.append(entry)
    root_pkg = packages[root]
    relationships = [{
        "spdxElementId": "SPDXRef-DOCUMENT",
        "relationshipType": "DESCRIBES",
        "relatedSpdxElement": spdx_id(root_pkg),
    }] + [{
        "spdxElementId": spdx_id(root_pkg),
        "relationshipType": "DEPENDS_ON",
        "relatedSpdxElement": e["SPDXID"],
    } for e in out if e["SPDXID"] != spdx_id(root_pkg)]
    body = json.dumps(out, sort_keys=True).encode()
    doc = {
        "spdxVersion": "SPDX-2.3",
        "dataLicense": "CC0-1.0",
        "SPDXID": "SPDXRef-DOCUMENT",
        "name": args.name,
        "documentNamespace": "https://podgroup-sync.io/spdx/" + hashlib.sha256(body).hexdigest(),
        "creationInfo": {
            "created": "1970-01-01T00:00:00Z",
            "creators": ["Tool: podgroup-sync hack/sbom.py"],
            "comment": "targets: " + ", ".join(args.target or ["host"]),
        },
        "packages": out,
        "relationships": relationships,
    }
    json.dump(doc, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""Rewrite Kubernetes manifests for `podman kube play` (podman 4.3) on a host-network-only machine.

    kube_hostnet.py deploy/kubernetes/keyflow.yaml [--image IMAGE] [--env KEY=VALUE ...]
                    [--port NAME=NUMBER ...] [--secret-dir DIR] > out.yaml

podman 4.3 plays only Pod, Deployment, PersistentVolumeClaim, ConfigMap and
Secret objects and silently skips the rest, and it publishes every
containerPort, which host networking forbids. So:
  - a StatefulSet becomes what its controller would create for each ordinal
    i < replicas: one PersistentVolumeClaim per volumeClaimTemplate, named
    <template>-<statefulset>-i, and a Pod <statefulset>-i whose volumes point
    at those claims (an env fieldRef to metadata.name becomes the pod's name,
    as the kubelet would resolve it);
  - Services and other kinds podman cannot play are dropped;
  - every pod gets hostNetwork: true; container ports are dropped; named probe
    ports are resolved to numbers (--port NAME=NUMBER overrides a named port's
    number first, for pods moved to free ports with --env);
  - imagePullPolicy: Never (there is no registry); --image replaces every
    container's image; --env sets or overrides container environment variables;
  - with --secret-dir, a volume from Secret NAME becomes a hostPath volume of
    DIR/NAME (the files deploy/make-secrets.sh writes), since there is no
    API server to hold Secrets;
  - an HTTPS httpGet probe becomes an exec probe running curl -k against
    127.0.0.1 (podman 4.3 turns httpGet probes into plain-http healthchecks).
The result goes to stdout.
"""
import argparse
import copy
import sys

import yaml

PLAYABLE = {"Pod", "Deployment", "PersistentVolumeClaim", "ConfigMap", "Secret"}


def statefulset_to_pods(sts):
    """The PVCs and the pods a StatefulSet controller creates, ordinal by ordinal."""
    name = sts["metadata"]["name"]
    spec = sts["spec"]
    out = []
    for ordinal in range(spec.get("replicas", 1)):
        pod_name = f"{name}-{ordinal}"
        template = copy.deepcopy(spec["template"])
        volumes = template["spec"].setdefault("volumes", [])
        for claim in spec.get("volumeClaimTemplates", []):
            claim_name = f"{claim['metadata']['name']}-{pod_name}"
            out.append({
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": {"name": claim_name, "labels": claim["metadata"].get("labels", {})},
                "spec": claim["spec"],
            })
            volumes.append({"name": claim["metadata"]["name"],
                            "persistentVolumeClaim": {"claimName": claim_name}})
        for c in template["spec"].get("containers", []):
            for e in c.get("env", []):
                ref = (e.get("valueFrom") or {}).get("fieldRef") or {}
                if ref.get("fieldPath") == "metadata.name":
                    del e["valueFrom"]
                    e["value"] = pod_name
        meta = template.get("metadata", {})
        meta["name"] = pod_name
        out.append({"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": template["spec"]})
    return out


def load(paths):
    """The documents podman can play, StatefulSets expanded into pods."""
    docs = []
    for path in paths:
        with open(path) as f:
            for d in yaml.safe_load_all(f):
                if not d:
                    continue
                if d.get("kind") == "StatefulSet":
                    docs.extend(statefulset_to_pods(d))
                elif d.get("kind") in PLAYABLE:
                    docs.append(d)
                else:
                    print(f"kube_hostnet.py: dropping {d.get('kind')} {d.get('metadata', {}).get('name')}",
                          file=sys.stderr)
    return docs


def rewrite_pod(pod, image=None, extra_env=None, port_override=None, secret_dir=None):
    """One pod spec for host networking without a registry or an API server."""
    extra_env = extra_env or {}
    port_override = port_override or {}
    pod["hostNetwork"] = True
    if secret_dir:
        for v in pod.get("volumes", []):
            secret = v.pop("secret", None)
            if secret is not None:
                v["hostPath"] = {"path": f"{secret_dir}/{secret['secretName']}",
                                 "type": "Directory"}
    for c in pod.get("containers", []) + pod.get("initContainers", []):
        named = {p["name"]: port_override.get(p["name"], p["containerPort"])
                 for p in c.get("ports", []) if p.get("name")}
        c.pop("ports", None)
        c["imagePullPolicy"] = "Never"
        if image:
            c["image"] = image
        if extra_env:
            env = c.setdefault("env", [])
            for e in env:
                if e.get("name") in extra_env:
                    e.pop("valueFrom", None)
                    e["value"] = extra_env[e["name"]]
            present = {e.get("name") for e in env}
            env += [{"name": k, "value": v} for k, v in extra_env.items() if k not in present]
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            for handler in ("httpGet", "tcpSocket", "grpc"):
                h = (c.get(probe) or {}).get(handler)
                if h and isinstance(h.get("port"), str):
                    h["port"] = named[h["port"]]
            spec = c.get(probe) or {}
            h = spec.get("httpGet")
            if h and h.get("scheme") == "HTTPS":
                del spec["httpGet"]
                spec["exec"] = {"command": ["curl", "-fsSk", "-o", "/dev/null", "--max-time", "2",
                                            f"https://127.0.0.1:{h['port']}{h['path']}"]}


def pod_spec(doc):
    """The pod spec of a Pod or a Deployment, else None."""
    if doc["kind"] == "Deployment":
        return doc["spec"]["template"]["spec"]
    if doc["kind"] == "Pod":
        return doc["spec"]
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("manifests", nargs="+")
    ap.add_argument("--image", help="image for every container")
    ap.add_argument("--env", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--port", action="append", default=[], metavar="NAME=NUMBER")
    ap.add_argument("--secret-dir", help="directory with one folder per Secret name")
    args = ap.parse_args()
    extra_env = dict(kv.split("=", 1) for kv in args.env)
    port_override = {k: int(v) for k, v in (kv.split("=", 1) for kv in args.port)}

    docs = load(args.manifests)
    for d in docs:
        pod = pod_spec(d)
        if pod is not None:
            rewrite_pod(pod, args.image, extra_env, port_override, args.secret_dir)
    yaml.safe_dump_all(docs, sys.stdout, sort_keys=False)


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""Rewrite deploy/kubernetes/keyflow-partitions.yaml for `podman kube play` on one host.

    kube_partitions.py MANIFEST --placement-out FILE --ports-out FILE
                       [--image IMAGE] [--secret-dir DIR] > out.yaml

The manifest is a StatefulSet of N pods, each serving the partitions its
`node` line in the placement ConfigMap gives it. On a host-network-only
machine the pods cannot all listen on the manifest's ports, so this turns
it into what the StatefulSet controller would create (kube_hostnet.py: N
pods, a PVC each) and gives each pod three free 127.0.0.1 ports picked now
(gRPC, HTTP, probe). The ConfigMap's placement keeps its partition count
and sets and gets those addresses in place of the headless Service's
names; the same text goes to --placement-out (for the clients and the
proxy). --ports-out gets one line per pod: NAME GRPC HTTP PROBE.

Refused: a placement whose node lines are not the StatefulSet's pod names
in order, or a pod count other than the node count, since the deployment
would then leave partitions unserved; and a StatefulSet whose
KEYFLOW_PARTITION_COUNT is not the placement's `partitions` count (the
pods must create the data set with it, whatever keyflowd's default).
"""
import argparse
import os
import socket
import sys

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kube_hostnet  # noqa: E402

PLACEMENT_CONFIGMAP_KEY = "placement"


def free_ports(n):
    """n distinct free TCP ports on 127.0.0.1 (held together, then released)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("manifest")
    ap.add_argument("--placement-out", required=True)
    ap.add_argument("--ports-out", required=True)
    ap.add_argument("--image")
    ap.add_argument("--secret-dir")
    args = ap.parse_args()

    with open(args.manifest) as f:
        raw = [d for d in yaml.safe_load_all(f) if d]
    sts = [d for d in raw if d.get("kind") == "StatefulSet"]
    maps = [d for d in raw if d.get("kind") == "ConfigMap"
            and PLACEMENT_CONFIGMAP_KEY in (d.get("data") or {})]
    if len(sts) != 1 or len(maps) != 1:
        sys.exit("kube_partitions.py: %s needs one StatefulSet and one ConfigMap with a "
                 "'placement' key (found %d and %d)" % (args.manifest, len(sts), len(maps)))
    name, replicas = sts[0]["metadata"]["name"], sts[0]["spec"].get("replicas", 1)
    pods = ["%s-%d" % (name, i) for i in range(replicas)]

    lines = maps[0]["data"][PLACEMENT_CONFIGMAP_KEY].splitlines()
    nodes = [ln.split() for ln in lines if ln.split()[:1] == ["node"]]
    if [n[1] for n in nodes] != pods:
        sys.exit("kube_partitions.py: the placement's nodes %s are not the StatefulSet's pods %s"
                 % ([n[1] for n in nodes], pods))
    # The count is fixed when a data set is created: every pod must create
    # it with the placement's, whatever keyflowd's default is.
    count = [ln.split()[1] for ln in lines if ln.split()[:1] == ["partitions"]]
    env = {e.get("name"): e.get("value") for c in sts[0]["spec"]["template"]["spec"]["containers"]
           for e in c.get("env", [])}
    if count != [env.get("KEYFLOW_PARTITION_COUNT")]:
        sys.exit("kube_partitions.py: the StatefulSet's KEYFLOW_PARTITION_COUNT (%s) is not the "
                 "placement's count (%s)" % (env.get("KEYFLOW_PARTITION_COUNT"), " ".join(count)))
    ports = free_ports(3 * len(pods))
    addr = {pod: ports[3 * i:3 * i + 3] for i, pod in enumerate(pods)}
    placement = []
    for ln in lines:
        words = ln.split()
        if words[:1] == ["node"]:
            g, h, _ = addr[words[1]]
            words[3:5] = ["127.0.0.1:%d" % g, "127.0.0.1:%d" % h]
            ln = " ".join(words)
        placement.append(ln)
    text = "\n".join(placement) + "\n"
    maps[0]["data"][PLACEMENT_CONFIGMAP_KEY] = text
    with open(args.placement_out, "w") as f:
        f.write(text)
    with open(args.ports_out, "w") as f:
        for pod in pods:
            f.write("%s %d %d %d\n" % ((pod,) + tuple(addr[pod])))

    docs = []
    for d in raw:
        if d is sts[0]:
            docs.extend(kube_hostnet.statefulset_to_pods(d))
        elif d.get("kind") in kube_hostnet.PLAYABLE:
            docs.append(d)
    for d in docs:
        pod = kube_hostnet.pod_spec(d)
        if pod is None:
            continue
        g, h, p = addr[d["metadata"]["name"]]
        env = {"KEYFLOW_GRPC_ADDRESS": "127.0.0.1:%d" % g,
               "KEYFLOW_HTTP_ADDRESS": "127.0.0.1:%d" % h,
               "KEYFLOW_PROBE_ADDRESS": "127.0.0.1:%d" % p}
        kube_hostnet.rewrite_pod(pod, args.image, env, {"grpc": g, "http": h, "probe": p},
                                 args.secret_dir)
    yaml.safe_dump_all(docs, sys.stdout, sort_keys=False)


if __name__ == "__main__":
    main()

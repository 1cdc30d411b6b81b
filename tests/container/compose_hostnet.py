#!/usr/bin/python3
"""Rewrite a compose file for a machine where containers may only use the host network.

    compose_hostnet.py deploy/docker-compose.yml [--image IMAGE] [--env KEY=VALUE ...]
                       [--secret-dir DIR] > out.yml

Every service joins the host network (network_mode: host) and loses what host
networking forbids or makes meaningless: published ports (docker-compose 1.29
refuses `ports:` together with host networking, and an override file cannot
delete them), networks, links, hostname, mac_address, dns. Service names
resolve to 127.0.0.1 through extra_hosts. Builds use the host network and an
absolute context, so the output may be written anywhere. --image replaces each
service's image (use with `up --no-build`); --env sets or overrides environment
variables of every service (e.g. loopback addresses on free ports, since all
services now share the host's ports). File secrets get absolute paths (their
relative ones are resolved against the compose file's folder, or against
--secret-dir in place of its "secrets" folder). The result goes to stdout.
"""
import argparse
import os
import sys

import yaml


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("compose_file")
    ap.add_argument("--image", help="image for every service")
    ap.add_argument("--env", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--secret-dir", help="use this folder for the file secrets' ./secrets/")
    args = ap.parse_args()

    with open(args.compose_file) as f:
        doc = yaml.safe_load(f)
    base = os.path.dirname(os.path.abspath(args.compose_file))
    extra_env = dict(kv.split("=", 1) for kv in args.env)

    services = doc.get("services") or {}
    names = sorted(set(services) | {s["hostname"] for s in services.values() if s.get("hostname")})
    for svc in services.values():
        for key in ("ports", "networks", "links", "hostname", "mac_address", "dns", "network_mode"):
            svc.pop(key, None)
        svc["network_mode"] = "host"
        svc["extra_hosts"] = list(svc.get("extra_hosts") or []) + [f"{n}:127.0.0.1" for n in names]
        if args.image:
            svc["image"] = args.image
        if extra_env:
            env = svc.get("environment") or {}
            if isinstance(env, list):  # ["KEY=VALUE", ...] form
                env = dict(e.split("=", 1) if "=" in e else (e, None) for e in env)
            env.update(extra_env)
            svc["environment"] = env
        build = svc.get("build")
        if build is not None:
            if isinstance(build, str):
                build = svc["build"] = {"context": build}
            build["context"] = os.path.normpath(os.path.join(base, build.get("context", ".")))
            build["network"] = "host"
    for secret in (doc.get("secrets") or {}).values():
        path = secret.get("file")
        if path is None:
            continue
        if args.secret_dir and path.startswith("./secrets/"):
            secret["file"] = os.path.join(os.path.abspath(args.secret_dir), path[len("./secrets/"):])
        else:
            secret["file"] = os.path.normpath(os.path.join(base, path))
    doc.pop("networks", None)
    yaml.safe_dump(doc, sys.stdout, sort_keys=False)


if __name__ == "__main__":
    main()

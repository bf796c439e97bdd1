"""A stand-in for a Kubernetes cluster on one machine whose nodes are network namespaces: it runs
the project's manifest (examples/kubernetes/flemu.yaml) as the kubelet would run its containers,
each in its node's namespace, in a mount namespace of its own (`unshare -m`) where each volume
is bind-mounted at its mountPath (read-only where the manifest says so), with the container's env
and, for an Indexed Job, JOB_COMPLETION_INDEX. The Service's name is resolved by the test
(/etc/netns/NS/hosts), as the cluster's DNS would. Its "image" is this machine's Python and
working directory. What it does not do: pull images, schedule, restart, enforce resources.

    python kube.py MANIFEST --pod-node NS --job-nodes NS,NS --volume NAME=DIR ...
"""
from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
from pathlib import Path

import yaml


def container_command(container: dict, volumes: dict[str, str], made: list[Path]) -> list[str]:
    """The container's command inside a mount namespace with its volumes at their mountPaths."""
    steps = []
    for mount in container.get("volumeMounts", []):
        target = Path(mount["mountPath"])
        if not target.exists():  # the image would have it; this machine may not (removed afterwards)
            missing = [p for p in (target, *target.parents) if not p.exists()]
            target.mkdir(parents=True)
            made += reversed(missing)
        source = volumes[mount["name"]]
        steps.append(f"mount --bind {shlex.quote(source)} {shlex.quote(str(target))}")
        if mount.get("readOnly"):
            steps.append(f"mount -o remount,bind,ro {shlex.quote(str(target))}")
    script = " && ".join([*steps, 'exec "$@"'])
    python = str(Path(sys.executable).parent)  # the image's python: this one
    return ["unshare", "-m", "--propagation", "private", "sh", "-c", f"PATH={python}:$PATH; {script}", "container",
            *container["command"]]


def start(ns: str, container: dict, volumes: dict[str, str], made: list[Path], extra_env: dict) -> subprocess.Popen:
    env = {**os.environ, **{e["name"]: e["value"] for e in container.get("env", [])}, **extra_env}
    return subprocess.Popen(["ip", "netns", "exec", ns, *container_command(container, volumes, made)], env=env)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("manifest")
    ap.add_argument("--pod-node", required=True)
    ap.add_argument("--job-nodes", required=True)
    ap.add_argument("--volume", action="append", default=[], help="NAME=DIR: what a volume of that name holds")
    args = ap.parse_args()
    volumes = dict(v.split("=", 1) for v in args.volume)
    docs = list(yaml.safe_load_all(Path(args.manifest).read_text()))
    made: list[Path] = []
    procs = []
    try:
        for doc in docs:
            spec = doc["spec"]
            if doc["kind"] == "Pod":
                procs += [start(args.pod_node, c, volumes, made, {}) for c in spec["containers"]]
            elif doc["kind"] == "Job":
                nodes = args.job_nodes.split(",")
                assert spec.get("completionMode") == "Indexed" and spec["parallelism"] == spec["completions"]
                for index in range(spec["completions"]):
                    procs += [start(nodes[index % len(nodes)], c, volumes, made, {"JOB_COMPLETION_INDEX": str(index)})
                              for c in spec["template"]["spec"]["containers"]]
        return max(p.wait() for p in procs)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        for target in reversed(made):
            target.rmdir()


if __name__ == "__main__":
    sys.exit(main())

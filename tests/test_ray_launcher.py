"""--launcher ray: the hosts are started as Ray tasks on a Ray cluster (here a local one of 2 CPUs)
and join over TCP with CURVE, and the run's results are those of the local launcher."""
from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, needs_mnist, run_cli
from test_remote_hosts import _same_results, namespaces_available, two_namespaces

ray = pytest.importorskip("ray", reason="the ray extra is not installed (pip install -e '.[ray]')")

SMOKE = ("scenarios/smoke.yaml", "--set", "task.model=mlp")  # smoke's MLP variant: the same run in seconds


@needs_mnist
def test_smoke_with_the_ray_launcher_gives_the_local_launcher_results(tmp_path):
    context = ray.init(num_cpus=2, include_dashboard=False, logging_level="warning")
    try:
        env = {**os.environ, "RAY_ADDRESS": context.address_info["gcs_address"]}
        res = subprocess.run([sys.executable, "-m", "emulator", "run", *SMOKE, "--launcher", "ray", "--hosts", "remote:2",
                              "--out", str(tmp_path / "ray"), "--quiet"], capture_output=True, text=True, timeout=300,
                             cwd=REPO, env=env)
    finally:
        ray.shutdown()
    assert res.returncode == 0, res.stderr[-3000:]
    local = run_cli("run", *SMOKE, "--set", "population.hosts=2", "--out", str(tmp_path / "local"), "--quiet")
    assert local.returncode == 0, local.stderr[-3000:]
    summary = json.loads((tmp_path / "ray" / "summary.json").read_text())
    assert summary["placement"]["launcher"] == "ray" and sorted(summary["placement"]["joined"]) == ["host0", "host1"]
    assert summary["rounds_completed"] == 3
    _same_results(tmp_path / "local", tmp_path / "ray")


# ---- two Ray nodes, two machines ------------------------------------------------------------------
NS_HEAD, NS_WORKER = f"flemu-rh{os.getpid() % 10000}", f"flemu-rw{os.getpid() % 10000}"
ADDR_HEAD, ADDR_WORKER = "10.213.11.1", "10.213.11.2"


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory):
    """A Ray head in one network namespace (no CPUs: it runs no task) and a Ray worker node of 2
    CPUs in another, joined by a veth pair: a two-machine Ray cluster as far as TCP is concerned.
    Ray 2.5x's cluster speaks token authentication here; the token is made for the test. In CI
    (root) a machine that cannot make namespaces fails the test instead of skipping it."""

    why = namespaces_available()
    if why:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the two-node Ray test across network namespaces, and cannot: {why}")
        pytest.skip(why)
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
    env.pop("RAY_ADDRESS", None)
    ray_cli = str(Path(sys.executable).with_name("ray"))

    def in_ns(ns: str, *cmd: str) -> None:
        res = subprocess.run(["ip", "netns", "exec", ns, *cmd], capture_output=True, text=True, env=env, timeout=120)
        assert res.returncode == 0, f"{' '.join(cmd)}: {res.stderr[-2000:]}"
    try:
        two_namespaces((NS_HEAD, "flemu-rh", ADDR_HEAD), (NS_WORKER, "flemu-rw", ADDR_WORKER))
        in_ns(NS_HEAD, ray_cli, "start", "--head", "--node-ip-address", ADDR_HEAD, "--port", "6379", "--num-cpus", "0",
              "--include-dashboard", "false", "--disable-usage-stats")
        in_ns(NS_WORKER, ray_cli, "start", "--address", f"{ADDR_HEAD}:6379", "--node-ip-address", ADDR_WORKER,
              "--num-cpus", "2", "--disable-usage-stats")
        yield {"head": ["ip", "netns", "exec", NS_HEAD], "env": {**env, "RAY_ADDRESS": f"{ADDR_HEAD}:6379"}}
    finally:
        subprocess.run([ray_cli, "stop", "--force"], capture_output=True, env=env, timeout=120)
        for ns in (NS_HEAD, NS_WORKER):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


@needs_mnist
def test_ray_places_the_hosts_on_the_worker_node_of_another_machine(tmp_path, ray_cluster):
    """The conductor drives the Ray cluster from the head's namespace; Ray places both host tasks
    on the worker node (the head has no CPUs), they join from the worker's address over TCP with
    CURVE, and the results equal the local launcher's."""
    res = subprocess.run([*ray_cluster["head"], sys.executable, "-m", "emulator", "run", *SMOKE, "--launcher", "ray",
                          "--hosts", "remote:2", "--out", str(tmp_path / "ray"), "--quiet"],
                         capture_output=True, text=True, timeout=300, cwd=REPO, env=ray_cluster["env"])
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads((tmp_path / "ray" / "summary.json").read_text())
    joined = summary["placement"]["joined"]
    assert sorted(joined) == ["host0", "host1"]
    assert {j["address"] for j in joined.values()} == {ADDR_WORKER}, joined  # not loopback, not the head
    assert summary["placement"]["lobby"].startswith(f"tcp://{ADDR_HEAD}:")
    local = run_cli("run", *SMOKE, "--set", "population.hosts=2", "--out", str(tmp_path / "local"), "--quiet")
    assert local.returncode == 0, local.stderr[-3000:]
    _same_results(tmp_path / "local", tmp_path / "ray")


def test_the_driver_address_is_the_one_that_reaches_the_ray_head():
    """Ray's own guess routes towards a public address, which a private cluster network lacks; the
    conductor asks for the address its packets to the head leave from."""
    from emulator.placement import Placement, ray_node_address  # noqa: PLC0415

    assert ray_node_address(Placement(launcher="ray", ray_address="127.0.0.1:6379")) == "127.0.0.1"

"""--launcher ray: the hosts are started as Ray tasks on a Ray cluster (here a local one of 2 CPUs)
and join over TCP with CURVE, and the run's results are those of the local launcher."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import REPO, needs_mnist, read_csv, run_cli

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
    for name in ("rounds.csv", "clients.csv", "transfers.csv"):
        a, b = read_csv(tmp_path / "local" / name), read_csv(tmp_path / "ray" / name)
        assert len(a) == len(b) > 0
        for x, y in zip(a, b):
            x.pop("wall_s", None)
            y.pop("wall_s", None)
            assert x == y, name

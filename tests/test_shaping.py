"""Fidelity against the kernel: one rate and size of tools/validate_shaping.py, run for real
between two network namespaces with tbf, when the machine allows it (root, iproute2)."""
import json
import subprocess
import sys

import pytest

from conftest import REPO


def test_link_model_agrees_with_tbf_at_100_mbit_for_1_mb():
    res = subprocess.run([sys.executable, str(REPO / "tools" / "validate_shaping.py"), "--rates", "100",
                          "--sizes", "1048576", "--transports", "tcp,zmq", "--reps", "5", "--json"],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    if res.stdout.startswith("SKIPPED"):
        pytest.skip(res.stdout.strip())
    results = json.loads(res.stdout)
    assert {r["transport"] for r in results} == {"tcp", "zmq"}
    for r in results:
        assert 0.95 <= r["ratio"] <= 1.05, r
    # nothing left behind
    leftovers = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert "flemu-" not in leftovers

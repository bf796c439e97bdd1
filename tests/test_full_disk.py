"""A results directory on a full filesystem (issue 47, item 4): a 40 KiB tmpfs fills after a few
rounds. The run stops with one error line (exit 1, no traceback), every CSV it leaves holds whole
rows of the same rounds, summary.json says so, and no process of the run is left."""
import csv
import json
import os
import subprocess

import psutil
import pytest

from conftest import run_cli, write_scenario

SCENARIO = """
name: full
seed: 3
rounds: 30
task: {dataset: synthetic, model: mlp, synthetic: {samples: 600, test_samples: 100, shape: [1, 28, 28], classes: 10}}
population: {clients: 20, hosts: 2, devices: [{ms_per_sample: 1}], links: [{up_mbps: 50, down_mbps: 50, latency_ms: 5}]}
selection: {clients_per_round: 10}
algorithm: {local_epochs: 1, batch_size: 20, lr: 0.1}
eval: {every: 0}
"""


@pytest.fixture
def small_disk(tmp_path):
    if os.geteuid() != 0:
        if os.environ.get("CI"):
            pytest.fail("CI runs as root: this test must mount its tmpfs there")
        pytest.skip("needs root to mount a small tmpfs")
    mnt = tmp_path / "disk"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=40k", "tmpfs", str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_a_full_disk_stops_the_run_and_leaves_whole_files(tmp_path, small_disk):
    out = small_disk / "run"
    res = run_cli("run", str(write_scenario(tmp_path / "s.yaml", SCENARIO)), "--out", str(out), "--quiet", timeout=120)
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr[-3000:]
    [line] = [x for x in res.stderr.splitlines() if x.startswith("error:")]
    assert f"cannot write the results in {out} (No space left on device)" in line
    rows = {}
    for name in ("rounds", "clients", "transfers"):
        with open(out / f"{name}.csv", newline="") as f:
            rows[name] = list(csv.DictReader(f))
        assert all(None not in r.values() and "" not in (r.get("round"),) for r in rows[name]), name  # no half row
    summary = json.loads((out / "summary.json").read_text())  # readable, whichever it is
    done = len(rows["rounds"])
    assert 1 <= done < 30 and f"after {done} rounds" in line
    if "summary.json could not be written either" in line:  # the disk stayed full: it is an earlier round's
        assert summary["status"] == "running" and summary["rounds_completed"] <= done
    else:
        assert summary["status"] == "failed" and summary["rounds_completed"] == done
    assert {int(r["round"]) for r in rows["clients"]} == set(range(done))  # the same rounds, whole
    assert not (out / "summary.json.tmp").exists() and not (out / "report.html.tmp").exists()
    left = [p.info for p in psutil.process_iter(["pid", "cmdline"]) if str(out) in " ".join(p.info["cmdline"] or [])]
    assert not left, left

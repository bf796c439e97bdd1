"""task.device: where hosts train. Placement is a pure function (hosts spread round-robin over the
visible GPUs, each GPU's memory shared equally); the hosts resolve it after the fork; a device that
cannot be had ends the run with one line naming task.device (auto falls back to the CPU instead)."""
import json
import os
import subprocess
import sys

import pytest

from conftest import REPO, read_csv, write_scenario
from node.device import DeviceError, DevicePlan, place

SCENARIO = """
name: device
seed: 3
rounds: 2
task:
  dataset: synthetic
  model: mlp
  synthetic: {samples: 400, test_samples: 100}
  device: DEVICE
population:
  clients: 4
  hosts: 2
  devices: [{ms_per_sample: 1}]
  links: [{up_mbps: 50, down_mbps: 50, latency_ms: 5}]
selection: {clients_per_round: 4}
algorithm: {local_epochs: 1, batch_size: 50}
eval: {every: 1}
"""


def test_cpu_is_the_cpu_whatever_is_visible():
    assert place(DevicePlan("cpu", 3), 1, gpus=4).device == "cpu"


def test_auto_without_a_gpu_falls_back_to_the_cpu_and_says_why():
    p = place(DevicePlan("auto", 2), 0, gpus=0, cuda_problem="no CUDA device is visible")
    assert (p.device, p.memory_fraction) == ("cpu", None)
    assert "auto" in p.reason and "no CUDA device is visible" in p.reason


@pytest.mark.parametrize("spec", ["cuda", "cuda:0"])
def test_cuda_without_a_gpu_is_a_one_line_error_naming_the_key(spec):
    with pytest.raises(DeviceError) as err:
        place(DevicePlan(spec, 2), 0, gpus=0)
    message = str(err.value)
    assert message.startswith(f"task.device: {spec} requested") and "\n" not in message and "auto" in message


def test_hosts_spread_round_robin_and_share_each_gpu_equally():
    plan = DevicePlan("auto", hosts=5)
    placed = [place(plan, h, gpus=2) for h in range(5)]
    assert [p.device for p in placed] == ["cuda:0", "cuda:1", "cuda:0", "cuda:1", "cuda:0"]
    # GPU 0 holds hosts 0, 2 and 4, GPU 1 hosts 1 and 3
    assert [p.memory_fraction for p in placed] == pytest.approx([1 / 3, 1 / 2, 1 / 3, 1 / 2, 1 / 3])


def test_a_named_gpu_takes_every_host_and_an_explicit_share_wins():
    placed = [place(DevicePlan("cuda:1", hosts=4), h, gpus=2) for h in range(4)]
    assert {p.device for p in placed} == {"cuda:1"} and placed[0].memory_fraction == pytest.approx(0.25)
    assert place(DevicePlan("cuda", hosts=4, memory_fraction=0.2), 3, gpus=1).memory_fraction == 0.2
    with pytest.raises(DeviceError, match=r"cuda:2 requested, but only 2 CUDA device\(s\) are visible"):
        place(DevicePlan("cuda:2", 1), 0, gpus=2)


def run(tmp_path, device: str, visible: str | None):
    tmp_path.mkdir(parents=True, exist_ok=True)
    out = tmp_path / "run"
    path = write_scenario(tmp_path / "s.yaml", SCENARIO.replace("DEVICE", device))
    env = os.environ.copy()
    if visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible
    res = subprocess.run([sys.executable, "-m", "emulator", "run", str(path), "--out", str(out), "--plain"],
                         capture_output=True, text=True, timeout=180, cwd=REPO, env=env)
    summary = json.loads((out / "summary.json").read_text()) if (out / "summary.json").exists() else {}
    return res, summary, out


def test_a_bad_device_name_is_refused_at_validation(tmp_path):
    res, _, _ = run(tmp_path, "gpu", None)
    assert res.returncode == 2
    assert "task.device: must be auto, cpu, cuda or cuda:N, got 'gpu'" in res.stderr and "Traceback" not in res.stderr


def test_forced_cpu_trains_on_the_cpu_and_the_run_says_so(tmp_path):
    res, summary, out = run(tmp_path, "cpu", None)
    assert res.returncode == 0, res.stderr[-2000:]
    # algorithm.cohort: auto trains one client at a time on a CPU (node/cohort.py)
    assert summary["training_devices"] == {"host0": {"device": "cpu", "cohort": 1}, "host1": {"device": "cpu", "cohort": 1}}
    assert len(read_csv(out / "rounds.csv")) == 2


def test_cuda_requested_without_cuda_fails_the_run_with_one_clear_line(tmp_path):
    res, summary, _ = run(tmp_path, "cuda", "")
    assert res.returncode == 1
    assert summary["status"] == "failed"
    assert summary["reason"].startswith("task.device: cuda requested, but no CUDA device is visible")
    assert "Traceback" not in res.stderr and "task.device: cuda requested" in res.stderr


def test_auto_without_cuda_falls_back_to_the_cpu_with_the_same_results_as_cpu(tmp_path):
    res, summary, out = run(tmp_path / "auto", "auto", "")
    assert res.returncode == 0, res.stderr[-2000:]
    assert {d["device"] for d in summary["training_devices"].values()} == {"cpu"}
    assert all("auto" in d["reason"] for d in summary["training_devices"].values())
    res_cpu, _, out_cpu = run(tmp_path / "cpu", "cpu", "")
    assert res_cpu.returncode == 0
    assert (out / "clients.csv").read_text() == (out_cpu / "clients.csv").read_text()


def gpu_visible() -> bool:
    """Asked in a child, so that this test process never initialises CUDA."""
    probe = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.is_available())"],
                           capture_output=True, text=True, timeout=120)
    return probe.stdout.strip() == "True"


def test_on_a_gpu_machine_hosts_train_on_cuda(tmp_path):
    if not gpu_visible():
        pytest.skip("no CUDA device visible")
    res, summary, out = run(tmp_path, "cuda", None)
    assert res.returncode == 0, res.stderr[-2000:]
    devices = summary["training_devices"]
    assert all(d["device"].startswith("cuda:") and d["memory_fraction"] > 0 for d in devices.values())
    assert float(read_csv(out / "rounds.csv")[-1]["accuracy"]) > 0

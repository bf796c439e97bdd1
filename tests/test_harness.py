"""The test harness itself: a run that outlives its time limit fails with what says why."""
import psutil
import pytest

from conftest import run_cli, write_scenario

# Starts in a second or two (synthetic data, a small model) and then runs far past the limit, so that
# at the limit every process is in its own loop: smoke.yaml's start (MNIST, the CNN) took 8-10 s on
# a loaded 2-core machine, and the network process was still importing when the stacks were taken.
ENDLESS = """
name: endless
rounds: 100000
task: {dataset: synthetic, model: mlp, synthetic: {samples: 400, test_samples: 100}}
population: {clients: 6, hosts: 1, devices: [{ms_per_sample: 1}], links: [{up_mbps: 20, down_mbps: 20, latency_ms: 5}]}
algorithm: {local_epochs: 1, batch_size: 20}
eval: {every: 0}
"""


def test_a_run_past_its_time_limit_fails_with_its_processes_stacks_and_the_machine_load(tmp_path):
    with pytest.raises(pytest.fail.Exception) as failed:
        run_cli("run", str(write_scenario(tmp_path / "s.yaml", ENDLESS)), "--out", str(tmp_path / "run"), timeout=10)
    text = str(failed.value)
    assert "still running after 10 s" in text
    for name in ("flemu-network", "flemu-server", "flemu-host0"):
        assert name in text, text[:3000]
    # every process dumps its stacks (faulthandler) and none dies of the signal: the network too
    assert "emulator/network.py" in text and "node/runtime.py" in text, text[-3000:]
    assert "killed by signal" not in text, text[:3000]
    assert "stolen by the hypervisor" in text
    alive = [p for p in psutil.process_iter(["name", "status"])
             if (p.info["name"] or "").startswith("flemu-") and p.info["status"] != psutil.STATUS_ZOMBIE]
    assert not alive  # all killed (orphans may stay zombies until the machine's init reaps them)

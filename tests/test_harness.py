"""The test harness itself: a run that outlives its time limit fails with what says why."""
import psutil
import pytest

from conftest import REPO, needs_mnist, run_cli


@needs_mnist
def test_a_run_past_its_time_limit_fails_with_its_processes_stacks_and_the_machine_load(tmp_path):
    with pytest.raises(pytest.fail.Exception) as failed:
        run_cli("run", str(REPO / "scenarios" / "smoke.yaml"), "--out", str(tmp_path / "run"), timeout=10)
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

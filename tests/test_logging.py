"""--log-level: every process of a run logs to stderr as itself ([conductor], [network], [server],
[hostN]); warning (the default) says only what went wrong, info what is built, started and each
round, debug every delivery the network makes and every message an actor gets or sends. A real run
on real processes, at each level."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from node import logs

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = """
name: logged
rounds: 1
task: {dataset: synthetic, model: mlp, synthetic: {samples: 120, test_samples: 40, shape: [1, 28, 28], classes: 10}}
population: {clients: 4, hosts: 2, devices: [{ms_per_sample: 1}], links: [{up_mbps: 10, down_mbps: 10, latency_ms: 10}]}
selection: {clients_per_round: 2}
algorithm: {local_epochs: 1, batch_size: 10, lr: 0.05}
"""


def run(tmp_path: Path, *level: str) -> subprocess.CompletedProcess:
    path = tmp_path / "logged.yaml"
    path.write_text(SCENARIO)
    env = {k: v for k, v in os.environ.items() if k != logs.LEVEL_VARIABLE}
    out = tmp_path / f"run-{level[-1] if level else 'default'}"
    return subprocess.run([sys.executable, "-m", "emulator", "run", str(path), "--quiet", "--out", str(out), *level],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_each_level_says_what_it_promises(tmp_path):
    quiet = run(tmp_path)
    assert quiet.returncode == 0, quiet.stderr
    assert quiet.stderr.strip() == ""  # nothing went wrong: nothing said

    info = run(tmp_path, "--log-level", "info")
    assert info.returncode == 0, info.stderr
    lines = info.stderr.splitlines()
    assert re.match(r"\[conductor\] world built in [\d.]+ s: 4 clients on 2 hosts, topology star, 1 rounds of fedavg",
                    lines[0])
    assert {f"[conductor] started {name}" for name in ("network", "server", "host0", "host1")} <= \
        {re.sub(r" \(pid \d+\)$", "", line) for line in lines}
    assert any(re.match(r"\[server\] round 0 at t=0\.000 s: selected 2 of 4 eligible", line) for line in lines)
    assert any(re.match(r"\[conductor\] round 0: 2 of 2 selected answered", line) for line in lines)
    assert not any(" deliver " in line for line in lines)

    debug = run(tmp_path, "--log-level", "debug")
    assert debug.returncode == 0, debug.stderr
    deliveries = [line for line in debug.stderr.splitlines() if line.startswith("[network] t=") and " deliver " in line]
    tasks = [line for line in deliveries if " task (round 0) " in line]
    assert len(tasks) == 2  # one task to each selected client, each through the network process
    # each host logs what its actors got, as itself; the server's sends too
    assert any(line.startswith("[host0] t=") and " <- server task (round 0" in line for line in debug.stderr.splitlines()) \
        or any(line.startswith("[host1] t=") and " <- server task (round 0" in line for line in debug.stderr.splitlines())
    assert any(line.startswith("[server] t=") and " -> " in line and " task (round 0" in line
               for line in debug.stderr.splitlines())


@pytest.mark.parametrize("given, env, expected", [
    (None, None, "warning"), ("debug", None, "debug"), (None, "info", "info"), ("error", "info", "error"),
    (None, "loud", "warning"),
])
def test_the_level_comes_from_the_option_then_the_environment(monkeypatch, given, env, expected):
    if env is None:
        monkeypatch.delenv(logs.LEVEL_VARIABLE, raising=False)
    else:
        monkeypatch.setenv(logs.LEVEL_VARIABLE, env)
    assert logs.level_name(given) == expected

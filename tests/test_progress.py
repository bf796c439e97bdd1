"""What a run shows while it goes: a live panel on a terminal, plain lines in logs, JSON lines for
scripts, nothing with --quiet."""
import json
import os
import pty
import select
import subprocess
import sys

from conftest import REPO, run_cli, write_scenario
from emulator.progress import RoundProgress, fmt_duration

SMALL = """
name: progress
seed: 4
rounds: 3
task:
  dataset: synthetic
  model: mlp
  synthetic: {samples: 300, test_samples: 20}
population:
  clients: 3
  hosts: 1
  devices: [{ms_per_sample: 1}]
  links: [{up_mbps: 20, down_mbps: 20, latency_ms: 5}]
selection: {clients_per_round: 3}
algorithm: {local_epochs: 1, batch_size: 50}
eval: {every: 1}
"""


def transfer(kind, rnd, src, dst, outcome="ok", payload=100, t_end=1.0):
    return {"kind": kind, "round": rnd, "src": src, "dst": dst, "outcome": outcome, "payload_bytes": payload, "t_end": t_end}


def test_the_round_in_progress_is_counted_from_finished_transfers():
    cur = RoundProgress(round=2)
    for rec in [transfer("task", 2, "server", "c0"), transfer("task", 2, "server", "c1"),
                transfer("task", 2, "server", "c2", outcome="offline", payload=999),
                transfer("update", 2, "c0", "server", payload=40, t_end=3.5),
                transfer("update", 1, "c9", "server", payload=40),  # of the round before: late
                transfer("update", 2, "c1", "server", outcome="link_down", payload=40)]:
        cur.transfer(rec)
    assert (cur.asked, cur.answered, cur.late, cur.dropped) == (3, 1, 1, 2)
    assert (cur.bytes_down, cur.bytes_up, cur.t) == (200, 40, 3.5)
    assert fmt_duration(3725) == "1h02m05s" and fmt_duration(65) == "1m05s" and fmt_duration(None) == "?"


def test_the_next_rounds_tasks_seen_before_this_rounds_row_count_for_the_next_round():
    """Issue 45: smoke's round 2 showed `asked 0 answered 2` and `down 0 B`. The next round's tasks
    leave as the server aggregates, and their records can reach the conductor before its round
    report: they count for the next round, whenever they come."""
    import io

    from emulator.progress import View

    view = View(3, out=io.StringIO())
    view.transfer(transfer("task", 0, "server", "c0"))
    view.transfer(transfer("update", 0, "c0", "server", payload=40, t_end=2.0))
    view.transfer(transfer("task", 1, "server", "c1", t_end=2.5))  # round 1's, before round 0's row
    view.transfer(transfer("task", 1, "server", "c2", t_end=2.6))
    assert (view.current.round, view.current.asked, view.current.answered) == (0, 1, 1)
    view.round({"round": 0, "t_start": 0.0, "t_end": 2.0, "completed": 1, "selected": 1, "failed": 0,
                "payload_bytes_down": 100, "payload_bytes_up": 40})
    assert (view.current.round, view.current.asked, view.current.bytes_down, view.current.t) == (1, 2, 200, 2.6)
    view.transfer(transfer("update", 1, "c1", "server", payload=40, t_end=4.0))
    assert (view.current.asked, view.current.answered, view.current.bytes_up) == (2, 1, 40)


def test_json_progress_is_one_object_per_line_and_quiet_is_quiet(tmp_path):
    path = write_scenario(tmp_path / "s.yaml", SMALL)
    res = run_cli("run", str(path), "--out", str(tmp_path / "j"), "--json-progress")
    assert res.returncode == 0, res.stderr[-2000:]
    lines = [json.loads(line) for line in res.stdout.splitlines()]
    assert [x["type"] for x in lines] == ["round", "round", "round", "summary"]
    assert [x["round"] for x in lines[:3]] == [0, 1, 2] and lines[2]["eta_s"] == 0.0
    assert all(x["accuracy"] is not None and x["wall_s"] > 0 for x in lines[:3])
    assert lines[3]["status"] == "completed" and "results:" in res.stderr
    quiet = run_cli("run", str(path), "--out", str(tmp_path / "q"), "--quiet")
    assert quiet.returncode == 0
    assert "round 1/3" not in quiet.stdout and quiet.stdout.startswith("completed: 3 rounds")
    plain = run_cli("run", str(path), "--out", str(tmp_path / "p"))  # not a terminal: plain lines
    assert "round 1/3  t=" in plain.stdout and "\x1b[" not in plain.stdout


def test_a_terminal_gets_the_live_panel(tmp_path):
    path = write_scenario(tmp_path / "s.yaml", SMALL.replace("rounds: 3", "rounds: 6"))
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "emulator", "run", str(path), "--out", str(tmp_path / "live")],
                            stdout=slave, stderr=slave, stdin=subprocess.DEVNULL, cwd=REPO,
                            env={**os.environ, "COLUMNS": "120", "TERM": "xterm"})
    os.close(slave)
    out = b""
    try:
        while True:
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # the child closed the terminal
                    break
                if not chunk:
                    break
                out += chunk
            elif proc.poll() is not None:
                break
        proc.wait(timeout=120)
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
    text = out.decode(errors="replace")
    assert proc.returncode == 0, text[-2000:]
    for label in ("flemu", "emulated", "ETA", "asked", "answered", "dropped", "accuracy"):
        assert label in text, label
    assert "round 6/6  t=" in text and "completed: 6 rounds" in text

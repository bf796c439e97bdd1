"""How the results writer gives transfers to rounds: the same rows whatever order the network's
records and the server's round reports reached the conductor in."""
from emulator.results import RunWriter


def _transfer(tid, rnd, kind, src, dst, t_start, t_end, outcome="ok", size=1000):
    return {"id": tid, "round": rnd, "kind": kind, "src": src, "dst": dst, "payload_bytes": size, "fp32_bytes": size,
            "wire_bytes": size, "link_bytes": size, "t_start": t_start, "t_end": t_end, "outcome": outcome, "wasted_bytes": 0}


def _report(rnd, t_start, t_end, clients):
    return {"type": "round", "round": rnd, "t_start": t_start, "t_end": t_end, "selected": len(clients),
            "completed": sum(c["outcome"] == "ok" for c in clients), "failed": sum(c["outcome"] != "ok" for c in clients),
            "rejected": 0, "clients": clients}


def _run(tmp_path, next_round_task_first: bool):
    """Round 0 ends at t = 2.0 and round 1 begins then: its task to c1 fails at once (the device is
    offline), a record that ends at 2.0 exactly and may reach the conductor before or after round 0's report."""
    writer = RunWriter(tmp_path, {"name": "s"}, [{"client": "c0"}, {"client": "c1"}])
    writer.transfer(_transfer(0, 0, "task", "server", "c0", 0.0, 1.0))
    writer.transfer(_transfer(1, 0, "update", "c0", "server", 1.5, 2.0))
    offline_task = _transfer(2, 1, "task", "server", "c1", 2.0, 2.0, outcome="offline")
    if next_round_task_first:
        writer.transfer(offline_task)
    writer.round(_report(0, 0.0, 2.0, [{"client": "c0", "outcome": "ok"}]), wall_s=1.0)
    if not next_round_task_first:
        writer.transfer(offline_task)
    writer.round(_report(1, 2.0, 4.0, [{"client": "c1", "outcome": "no_update"}]), wall_s=2.0)
    rows = [{k: v for k, v in row.items() if k != "wall_s"} for row in writer.rows]
    return rows, writer


def test_a_transfer_of_the_next_round_that_ends_as_this_one_does_waits_for_its_own(tmp_path):
    first, w1 = _run(tmp_path / "a", next_round_task_first=True)
    second, w2 = _run(tmp_path / "b", next_round_task_first=False)
    assert first == second
    # round 1's failed task is round 1's: c1 is dropped offline there, not a client that never got its task
    assert w1.outcomes == w2.outcomes and w1.outcomes["dropped_offline"] == 1

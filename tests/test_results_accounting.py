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


def _ring_run(tmp_path, late_gossip_first: bool):
    """A ring's round 0 ends at t = 5.0 (both clients reported it); c1's last gossip of round 0 to a
    neighbour that had timed out is still in flight and arrives at t = 6.0, during round 1. Its
    record may reach the conductor before or after the clients' round-0 reports (they travel on a
    thread of their own): either way it is round 1's row's."""
    from emulator.results import RingRounds

    writer = RunWriter(tmp_path, {"name": "ring"}, [{"client": "c0"}, {"client": "c1"}])
    rows = RingRounds(["c0", "c1"])
    late = _transfer(2, 0, "gossip", "c1", "c0", 4.0, 6.0, size=700)
    writer.transfer(_transfer(0, 0, "gossip", "c0", "c1", 1.0, 2.0))
    writer.transfer(_transfer(1, 0, "gossip", "c1", "c0", 1.0, 2.5))
    if late_gossip_first:
        writer.transfer(late)
    for client, t_end in (("c0", 5.0), ("c1", 4.5)):
        for rep in rows.add({"round": 0, "client": client, "t_start": 0.0, "t_end": t_end}):
            writer.round(rep, wall_s=1.0)
    if not late_gossip_first:
        writer.transfer(late)
    writer.transfer(_transfer(3, 1, "gossip", "c0", "c1", 6.0, 7.0))
    for client in ("c0", "c1"):
        for rep in rows.add({"round": 1, "client": client, "t_start": 5.0, "t_end": 8.0}):
            writer.round(rep, wall_s=2.0)
    return [{k: v for k, v in row.items() if k != "wall_s"} for row in writer.rows]


def test_a_ring_rounds_late_gossip_counts_where_it_arrives_whatever_the_order_of_records(tmp_path):
    first = _ring_run(tmp_path / "a", late_gossip_first=True)
    second = _ring_run(tmp_path / "b", late_gossip_first=False)
    assert first == second
    assert [row["payload_bytes_peer"] for row in first] == [2000, 1700]

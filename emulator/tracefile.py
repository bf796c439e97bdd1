"""A run as a timeline for Perfetto UI or chrome://tracing: RUN_DIR/trace.json in the Chrome Trace
Event format, made from the run's own records (clients.csv, rounds.csv, transfers.csv, summary.json).

- Process "server": a slice per round (its emulated start to end), the server's modelled aggregation
  at each round's end (server.aggregate_ms, on a star), and a counter of the payload bytes in flight
  over the network (every transfer adds its bytes at its start, removes them at its end).
- Process "clients": a track per client that took part, with its slices per round: check-in,
  download, compute, upload and gossip (a ring's), each from clients.csv's times; its outcome and
  round are the slice's arguments.
- Process "batteries": a counter per client with a battery, its level (0-1) at each of its device
  events (devices.csv: training, sending, charging, going off and on).
- Instants for the incidents that carry an emulated time.

Times are emulated seconds, written as the format's microseconds. Size: the flagship's 20 rounds
(2,600 sessions, 10,000 transfers, 16,000 battery levels) make 24,700 events, 3.0 MB."""
from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any, Iterator

import yaml

US = 1e6
SERVER_PID, CLIENTS_PID, BATTERIES_PID = 1, 2, 3
PHASES = (("download", "download_start", "download_end"), ("compute", "compute_start", "compute_end"),
          ("upload", "upload_start", "upload_end"), ("gossip", "gossip_start", "gossip_end"))


def read_rows(path: Path) -> list[dict[str, str]]:
    """A CSV of the run directory as rows (none when the file is not there)."""
    if not path.exists():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def time_of(value: str | None) -> float | None:
    """A time cell: its float, or None when empty or not a number."""
    try:
        return float(value) if value not in (None, "") else None
    except ValueError:
        return None


def _slice(name: str, pid: int, tid: int, start: float, end: float, args: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "ph": "X", "pid": pid, "tid": tid, "ts": start * US, "dur": max(0.0, end - start) * US,
            "args": args}


def _client_events(clients: list[dict[str, str]], checkins: dict[str, list[tuple[float, float]]],
                   tids: dict[str, int]) -> Iterator[dict[str, Any]]:
    for row in clients:
        tid = tids[row["client"]]
        args = {"round": int(row["round"]), "outcome": row["outcome"]}
        for name, start_key, end_key in PHASES:
            start, end = time_of(row.get(start_key)), time_of(row.get(end_key))
            if start is not None and end is not None:
                yield _slice(name, CLIENTS_PID, tid, start, end, args)
    for client, spans in checkins.items():
        for start, end in spans:
            yield _slice("check-in", CLIENTS_PID, tids[client], start, end, {})


def _bytes_in_flight(transfers: list[dict[str, str]]) -> Iterator[dict[str, Any]]:
    changes: dict[float, int] = {}
    for t in transfers:
        start, end, size = time_of(t["t_start"]), time_of(t["t_end"]), int(t["payload_bytes"] or 0)
        if start is None or end is None:
            continue
        changes[start] = changes.get(start, 0) + size
        changes[end] = changes.get(end, 0) - size
    level = 0
    for at in sorted(changes):
        level += changes[at]
        yield {"name": "payload bytes in flight", "ph": "C", "pid": SERVER_PID, "ts": at * US, "args": {"bytes": level}}


def _aggregate_s(run_dir: Path) -> float:
    """The server's modelled aggregation time of a star's rounds (server.aggregate_ms); 0 elsewhere."""
    path = run_dir / "scenario.yaml"
    scenario = (yaml.safe_load(path.read_text()) or {}) if path.exists() else {}
    if scenario.get("topology", "star") != "star":
        return 0.0
    return float((scenario.get("server") or {}).get("aggregate_ms") or 0.0) / 1000.0


def _batteries(devices: list[dict[str, str]]) -> list[dict[str, Any]]:
    """A counter track per client: its battery level at each device event that reports one."""
    out = [{"name": "process_name", "ph": "M", "pid": BATTERIES_PID, "args": {"name": "batteries"}}]
    for row in devices:  # a full log's events, or a summary's rows (the level after each round's last event)
        level, at = time_of(row.get("battery")), time_of(row.get("t", row.get("t_last")))
        if level is not None and at is not None:
            out.append({"name": f"battery {row['client']}", "ph": "C", "pid": BATTERIES_PID, "ts": at * US,
                        "args": {"level": level}})
    return out if len(out) > 1 else []


def trace_events(run_dir: Path) -> list[dict[str, Any]]:
    clients = read_rows(run_dir / "clients.csv")
    transfers = read_rows(run_dir / "transfers.csv")
    checkins: dict[str, list[tuple[float, float]]] = {}
    for t in transfers:
        if t["kind"] == "checkin" and t["outcome"] == "ok":
            checkins.setdefault(t["src"], []).append((float(t["t_start"]), float(t["t_end"])))
    names = sorted({row["client"] for row in clients} | set(checkins))
    tids = {name: i + 1 for i, name in enumerate(names)}
    events: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": SERVER_PID, "args": {"name": "server"}},
        {"name": "process_name", "ph": "M", "pid": CLIENTS_PID, "args": {"name": "clients"}},
        {"name": "thread_name", "ph": "M", "pid": SERVER_PID, "tid": 0, "args": {"name": "rounds"}},
        *({"name": "thread_name", "ph": "M", "pid": CLIENTS_PID, "tid": tid, "args": {"name": name}}
          for name, tid in tids.items()),
    ]
    aggregate_s = _aggregate_s(run_dir)
    if aggregate_s:
        events.append({"name": "thread_name", "ph": "M", "pid": SERVER_PID, "tid": 1, "args": {"name": "aggregation"}})
    for row in read_rows(run_dir / "rounds.csv"):
        t_start, t_end = float(row["t_start"]), float(row["t_end"])
        events.append(_slice(f"round {int(row['round']) + 1}", SERVER_PID, 0, t_start, t_end,
                             {"selected": row.get("selected"), "completed": row.get("completed"),
                              "failed": row.get("failed")}))
        if aggregate_s:  # the server's modelled aggregation ends its round (node/server.py's _close)
            events.append(_slice("aggregation", SERVER_PID, 1, max(t_start, t_end - aggregate_s), t_end,
                                 {"round": int(row["round"])}))
    events += _client_events(clients, checkins, tids)
    events += _bytes_in_flight(transfers)
    events += _batteries(read_rows(run_dir / "devices.csv") if (run_dir / "devices.csv").exists() else [])
    summary_path = run_dir / "summary.json"
    if summary_path.exists():
        for incident in json.loads(summary_path.read_text()).get("incidents") or []:
            at = next((incident[k] for k in ("t", "emulated_time_s", "t_net") if isinstance(incident.get(k), (int, float))), None)
            if at is not None:
                events.append({"name": str(incident.get("what"))[:80], "ph": "i", "s": "g", "pid": SERVER_PID, "tid": 0,
                               "ts": float(at) * US, "args": {k: str(v)[:200] for k, v in incident.items()}})
    return events


def write_trace(run_dir: Path) -> Path:
    """RUN_DIR/trace.json from the run's records."""
    path = run_dir / "trace.json"
    path.write_text(json.dumps({"traceEvents": trace_events(run_dir), "displayTimeUnit": "ms",
                                "otherData": {"emulated_time": "ts and dur are emulated microseconds"}}))
    return path

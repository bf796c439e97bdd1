"""What secure aggregation cost, as the run writes it: secure.csv, one row per round and phase
(its emulated start and end, how many entered and answered, the bytes of its messages each way),
and summary.json's secure_aggregation (totals, and the overhead against the same fixed-point sum
sent without masks, keys or shares).

A phase's bytes are its messages' (the server's message that opens it and the clients' answers):
keys: sa_keys; shares: sa_roster, sa_shares; input: sa_relay, sa_masked; unmask: sa_survivors,
sa_unmask. The model's download (task) is the round's, not a phase's.

Overhead, defined against protocol plain (the same encoding and sum, no masks): every byte of the
key, shares and unmask phases and of the relay, plus the masked vectors' extra bits (m - b of
every m); in time, the key and shares phases before training could start, the unmask phase and
the server's unmasking after the last masked input came."""
from __future__ import annotations

from collections import defaultdict
from typing import Any

SECURE_FIELDS = ["round", "aggregator", "phase", "t_start", "t_end", "duration_s", "entered", "answered", "payload_bytes_down",
                 "payload_bytes_up", "wire_bytes_down", "wire_bytes_up"]
PHASE_OF_KIND = {"sa_keys": "keys", "sa_roster": "shares", "sa_shares": "shares", "sa_relay": "input",
                 "sa_masked": "input", "sa_survivors": "unmask", "sa_unmask": "unmask"}
UPLOAD_KINDS = ("update", "sa_masked")  # a client's upload of its model, in the clear or masked


def phase_rows(rep: dict, transfers: list[dict], server: str) -> list[dict[str, Any]]:
    """secure.csv's rows of one round of `server` (the server, or an edge of a hierarchy: its own
    rounds), from its report's phases and its transfers."""
    sums: dict[tuple[str, str], int] = defaultdict(int)
    for rec in transfers:
        phase = PHASE_OF_KIND.get(rec["kind"])
        if phase is None or rec["outcome"] != "ok" or rec["round"] != rep["round"] or server not in (rec["src"], rec["dst"]):
            continue
        way = "down" if rec["src"] == server else "up"
        sums[(phase, f"payload_bytes_{way}")] += rec["payload_bytes"]
        sums[(phase, f"wire_bytes_{way}")] += rec["wire_bytes"]
    rows = []
    for p in rep["secure"]["phases"]:
        end = p.get("t_end")
        rows.append({"round": rep["round"], "aggregator": server, "phase": p["phase"], "t_start": p["t_start"], "t_end": end,
                     "duration_s": end - p["t_start"] if end is not None else None, "entered": p["entered"],
                     "answered": p.get("answered"),
                     **{f: sums[(p["phase"], f)] for f in SECURE_FIELDS if "bytes" in f}})
    return rows


class SecureTotals:
    """summary.json's secure_aggregation, added to round by round."""

    def __init__(self) -> None:
        self.state: dict[str, Any] = {"rounds": 0, "failed_rounds": 0, "bytes": {}, "seconds": {}, "server_compute_s": 0.0,
                                      "overhead_bytes": 0.0, "overhead_s": 0.0}

    def add(self, rep: dict, rows: list[dict]) -> None:
        s, secure = self.state, rep["secure"]
        s.update(protocol=secure["protocol"], degree_last=secure["degree"], threshold_last=secure["threshold"],
                 word_bits=secure["word_bits"], bits=secure.get("bits"))
        s["rounds"] += 1
        s["failed_rounds"] += int(bool(secure["failed"]))
        s["server_compute_s"] += secure.get("server_s") or 0.0
        s["overhead_s"] += secure.get("server_s") or 0.0
        for row in rows:
            phase = row["phase"]
            wire = row["wire_bytes_up"] + row["wire_bytes_down"]
            s["bytes"][phase] = s["bytes"].get(phase, 0) + wire
            s["seconds"][phase] = s["seconds"].get(phase, 0.0) + (row["duration_s"] or 0.0)
            if phase in ("keys", "shares", "unmask"):
                s["overhead_bytes"] += wire
                s["overhead_s"] += row["duration_s"] or 0.0
            elif phase == "input" and secure["protocol"] != "plain":
                bits, words = secure.get("bits") or secure["word_bits"], secure["word_bits"]
                s["overhead_bytes"] += row["wire_bytes_down"] + row["payload_bytes_up"] * (words - bits) / words

    def summary(self, rows: list[dict]) -> dict[str, Any]:
        """With the run's totals: the overhead as a share of all bytes and of the emulated time."""
        s = dict(self.state)
        total_bytes = sum(sum(r.get(f) or 0 for f in ("wire_bytes_down", "wire_bytes_up")) for r in rows)
        total_s = rows[-1]["t_end"] - rows[0]["t_start"] if rows else 0.0
        s["overhead_share_of_bytes"] = s["overhead_bytes"] / total_bytes if total_bytes else None
        s["overhead_share_of_time"] = s["overhead_s"] / total_s if total_s else None
        return s

"""devices.csv as a summary (run.device_log: summary, the default): one row per device and round in
which the device had events, so that the file grows with the work the run gave its devices and with
the devices that changed state, not with every draw of energy. `full` keeps the event log (a row per
event: emulator/results.py's DEVICE_FIELDS).

An event belongs to the round whose span holds its emulated time: the first round whose end is at
or after it (an event at a round's very end is that round's); events after the last round's end
make one more round's rows at the end of the run. Records reach the conductor in the order of their
emulated times, but not in a fixed order with the round reports (the network releases what a
delivery's answer caused once every delivery of that instant is answered). So a round's rows are
written once a record later than its end has come, or when the run ends: never before an event of
the round can still arrive, so the file is the same whenever the reports happen to come."""
from __future__ import annotations

import bisect
from typing import Any

# the events a device can have (emulator/timeline.py), counted per row; "battery" (ran dry) is ran_dry
EVENTS = ("train", "send", "receive", "offline", "online", "ran_dry", "link_down", "link_up")
SUMMARY_FIELDS = ["round", "client", "events", "t_first", "t_last", "energy_j", "battery", *EVENTS]


class DeviceSummary:
    """Device events counted per (round, device); each round's rows handed out once they are final."""

    def __init__(self) -> None:
        self.ends: list[float] = []  # each reported round's end, as a running maximum
        self.labels: list[int] = []  # each reported round's number
        self.counted: dict[int, dict[str, dict[str, Any]]] = {}  # round position -> device -> its row so far
        self.after: list[dict[str, Any]] = []  # events after the last reported round's end, not yet placed
        self.written = 0  # rounds whose rows are out
        self.latest = float("-inf")  # the latest event time seen

    def add(self, rec: dict[str, Any]) -> list[dict[str, Any]]:
        """A device event; the rows that are final now."""
        t = rec["t"]
        self.latest = max(self.latest, t)
        position = bisect.bisect_left(self.ends, t)
        if position == len(self.ends):
            self.after.append(rec)
        else:  # (a record that came after its round's rows went out would join the next round's)
            self._count(max(position, self.written), rec)
        return self._final()

    def round_ended(self, label: int, t_end: float) -> list[dict[str, Any]]:
        """A round's row was written: the events up to its end are its own; the rows final now."""
        end = max(t_end, self.ends[-1]) if self.ends else t_end
        self.ends.append(end)
        self.labels.append(label)
        position, later = len(self.ends) - 1, []
        for rec in self.after:
            if rec["t"] <= end:
                self._count(position, rec)
            else:
                later.append(rec)
        self.after = later
        return self._final()

    def close(self) -> list[dict[str, Any]]:
        """The rows still held when the run ends: every reported round's, then the events after them."""
        rows = self._final(every_round=True)
        if self.after:
            label = self.labels[-1] + 1 if self.labels else 0
            position = len(self.ends)
            for rec in self.after:
                self._count(position, rec)
            self.after = []
            rows += self._rows(position, label)
        return rows

    def _final(self, every_round: bool = False) -> list[dict[str, Any]]:
        """The rows of the reported rounds not yet out that a later event closed (or all of them)."""
        rows = []
        while self.written < len(self.ends) and (every_round or self.ends[self.written] < self.latest):
            rows += self._rows(self.written, self.labels[self.written])
            self.written += 1
        return rows

    def _rows(self, position: int, label: int) -> list[dict[str, Any]]:
        devices = self.counted.pop(position, {})
        return [{"round": label, **devices[name]} for name in sorted(devices)]

    def _count(self, position: int, rec: dict[str, Any]) -> None:
        devices = self.counted.setdefault(position, {})
        row = devices.get(rec["client"])
        if row is None:
            row = devices[rec["client"]] = {"client": rec["client"], "events": 0, "t_first": rec["t"], "t_last": rec["t"],
                                            "energy_j": 0.0, "battery": None, **{e: 0 for e in EVENTS}}
        event = "ran_dry" if rec["event"] == "battery" else rec["event"]
        row["events"] += 1
        row["t_first"] = min(row["t_first"], rec["t"])
        row["t_last"] = max(row["t_last"], rec["t"])
        if event in EVENTS:
            row[event] += 1
        if rec.get("energy_j") is not None:
            row["energy_j"] += rec["energy_j"]
        if rec.get("battery") is not None:
            row["battery"] = rec["battery"]  # the level after the device's last event that reports one

"""What the terminal shows while a run goes: a live panel on a terminal, one plain line per round
otherwise (CI, logs), one JSON object per round for scripts, or nothing.

The conductor tells a view about every finished transfer, every finished round and every
incident; the view keeps the state of the round in progress from them."""
from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from typing import Any, TextIO

from .secure_results import UPLOAD_KINDS
from .results import SERVER, fmt_bytes


@dataclass
class RoundProgress:
    """The round in progress, as far as finished transfers tell."""

    round: int = 0
    asked: int = 0  # tasks delivered or lost on the way
    answered: int = 0  # updates that arrived
    late: int = 0  # updates of an earlier round
    dropped: int = 0  # tasks or updates lost (offline, battery, link down, host lost)
    bytes_up: int = 0
    bytes_down: int = 0
    t: float = 0.0  # emulated time of the latest event seen

    def transfer(self, rec: dict[str, Any]) -> None:
        self.t = max(self.t, float(rec.get("t_end") or 0.0))
        ok = rec.get("outcome") == "ok"
        if rec.get("kind") not in ("task", "gossip", *UPLOAD_KINDS):
            return
        if rec["round"] < self.round:
            self.late += rec["kind"] in UPLOAD_KINDS and ok
            return
        up = rec["dst"] == SERVER
        if ok:
            if up:
                self.bytes_up += int(rec["payload_bytes"])
            else:
                self.bytes_down += int(rec["payload_bytes"])
        if rec["kind"] == "task":
            self.asked += 1
        elif rec["kind"] in UPLOAD_KINDS and ok:
            self.answered += 1
        self.dropped += not ok


def round_line(row: dict[str, Any], rounds: int, ring: bool, lag: dict | None) -> str:
    acc = f"  acc {row['accuracy']:.4f}" if row.get("accuracy") is not None else ""
    if row.get("bits_down") is not None:
        up = f"/{row['bits_up_mean']:.1f}" if row.get("bits_up_mean") is not None else ""
        acc = f"  bits {row['bits_down']}{up}{acc}"
    traffic = (f"peer {fmt_bytes(row['payload_bytes_peer'])}" if ring else
               f"down {fmt_bytes(row['payload_bytes_down'])} up {fmt_bytes(row['payload_bytes_up'])}")
    lag_text = f"  lag p99 {1000 * lag['p99_s']:.1f} ms" if lag else ""
    return (f"round {row['round'] + 1}/{rounds}  t={row['t_end']:.3f}s  "
            f"ok {row['completed']}/{row['selected']} failed {row['failed']}  {traffic}{acc}{lag_text}")


def fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s" if m else f"{s}s"


class View:
    """The plain view: one line per round and per incident, to `out`."""

    def __init__(self, rounds: int, ring: bool = False, out: TextIO | None = None):
        self.rounds = rounds
        self.ring = ring
        self.out = out if out is not None else sys.stdout
        self.t0 = time.monotonic()
        self.current = RoundProgress()
        # transfers of rounds after the current one, seen before the current one's row: the next
        # round's tasks leave as soon as the server has aggregated, and their records can reach the
        # conductor before the server's round report does (they travel by different processes)
        self.ahead: dict[int, RoundProgress] = {}
        self.done = 0
        self.last_row: dict[str, Any] | None = None
        self.last_incident: str | None = None
        self.lag: dict | None = None

    def eta_s(self) -> float | None:
        if not self.done:
            return None
        return (time.monotonic() - self.t0) / self.done * max(0, self.rounds - self.done)

    def transfer(self, rec: dict[str, Any]) -> None:
        later = rec.get("round")
        if isinstance(later, int) and later > self.current.round:
            self.ahead.setdefault(later, RoundProgress(round=later)).transfer(rec)
            self.current.t = max(self.current.t, float(rec.get("t_end") or 0.0))
            return
        self.current.transfer(rec)

    def round(self, row: dict[str, Any], lag: dict | None = None) -> None:
        self.done += 1
        self.last_row, self.lag = row, lag or self.lag
        following = row["round"] + 1
        current = self.ahead.pop(following, None) or RoundProgress(round=following)
        current.t = max(current.t, row["t_end"])
        self.ahead = {r: p for r, p in self.ahead.items() if r > following}
        self.current = current
        self.show_round(row)

    def note(self, text: str) -> None:
        self.last_incident = text
        self.show_note(text)

    def show_round(self, row: dict[str, Any]) -> None:
        print(round_line(row, self.rounds, self.ring, self.lag), file=self.out, flush=True)

    def show_note(self, text: str) -> None:
        print(f"! {text}", file=self.out, flush=True)

    def close(self) -> None:
        pass


class QuietView(View):
    def show_round(self, row: dict[str, Any]) -> None:
        pass

    def show_note(self, text: str) -> None:
        pass


class JsonView(View):
    """One JSON object per line on stdout: a round as it finishes, an incident as it happens."""

    def show_round(self, row: dict[str, Any]) -> None:
        wall = time.monotonic() - self.t0
        record = {"type": "round", **row, "rounds": self.rounds, "wall_s": wall, "eta_s": self.eta_s(), "lag": self.lag}
        print(json.dumps(record, default=float), file=self.out, flush=True)

    def show_note(self, text: str) -> None:
        print(json.dumps({"type": "incident", "what": text}), file=self.out, flush=True)


class LiveView(View):
    """A rich panel redrawn four times a second; finished rounds scroll above it as lines."""

    def __init__(self, rounds: int, ring: bool = False, out: TextIO | None = None, realtime: bool = False):
        super().__init__(rounds, ring, out)
        from rich.console import Console  # noqa: PLC0415  (only on a terminal)
        from rich.live import Live  # noqa: PLC0415

        self.realtime = realtime
        self.console = Console(file=self.out)
        self.live = Live(self, console=self.console, refresh_per_second=4, transient=True)
        self.live.start()

    def __rich__(self):
        from rich.panel import Panel  # noqa: PLC0415
        from rich.table import Table  # noqa: PLC0415

        cur, wall = self.current, time.monotonic() - self.t0
        grid = Table.grid(padding=(0, 2))
        grid.add_column(style="bold")
        grid.add_column()
        grid.add_row("round", f"{min(cur.round + 1, self.rounds)}/{self.rounds}")
        grid.add_row("time", f"emulated {cur.t:.3f} s   wall {fmt_duration(wall)}   ETA {fmt_duration(self.eta_s())}")
        grid.add_row("clients", f"asked {cur.asked}   answered {cur.answered}   late {cur.late}   dropped {cur.dropped}")
        grid.add_row("bytes", f"up {fmt_bytes(cur.bytes_up)}   down {fmt_bytes(cur.bytes_down)}   (this round)")
        last = self.last_row or {}
        if last.get("bits_down") is not None:
            up = f" / up {last['bits_up_mean']:.1f}" if last.get("bits_up_mean") is not None else ""
            grid.add_row("bits", f"down {last['bits_down']}{up}   (last round)")
        if last.get("accuracy") is not None:
            grid.add_row("accuracy", f"{last['accuracy']:.4f}   (after round {last['round'] + 1})")
        if self.realtime:
            lag = self.lag or {}
            grid.add_row("lag", f"p99 {1000 * lag.get('p99_s', 0.0):.1f} ms   max {1000 * lag.get('max_s', 0.0):.1f} ms")
        if self.last_incident:
            grid.add_row("incident", self.last_incident)
        return Panel(grid, title="flemu", expand=False)

    def show_round(self, row: dict[str, Any]) -> None:
        self.console.print(round_line(row, self.rounds, self.ring, self.lag), highlight=False)

    def show_note(self, text: str) -> None:
        self.console.print(f"! {text}", style="yellow", highlight=False)

    def close(self) -> None:
        self.live.stop()


def make_view(mode: str, rounds: int, ring: bool, realtime: bool) -> View:
    """mode: auto (a live panel on a terminal, plain lines otherwise) | plain | quiet | json."""
    if mode == "quiet":
        return QuietView(rounds, ring)
    if mode == "json":
        return JsonView(rounds, ring)
    if mode == "auto" and sys.stdout.isatty():
        return LiveView(rounds, ring, realtime=realtime)
    return View(rounds, ring)

"""Checkpoints of the network process: taken at an instant when nothing is under way, written with
every peer's part into a staging folder, and restored from it when a run resumes."""
from __future__ import annotations

import itertools
import os
import pickle
import shutil
import time
from typing import Any

from protocol import envelope

from .clock import peek
from .netconfig import CONDUCTOR

MIN_PART_BYTES = 1 << 20  # a remote host's checkpoint part travels in messages of at most half the frame limit


class Checkpoints:
    def __init__(self, net: Any):
        self.net = net  # the network process whose parts are saved (emulator/network.py)
        self.waiting: set[str] = set()  # peers still writing their part of a checkpoint
        self.failed: list[str] = []
        self.round = -1
        self.paused_at: float | None = None  # realtime mode: the wall time the clock stopped for a checkpoint

    def begin(self, sock: Any, round_: int) -> None:
        """A checkpoint of the run at this instant: every event before it is done, and (the lower
        bound says so) no actor can still send anything earlier. It is taken only when nothing is
        under way: no transfer in flight and no actor working, so that every process's state is data.
        Events already queued for later (timers, device changes, deliveries of finished transfers)
        are part of the network's state."""
        net = self.net
        why = ("transfers in flight" if net.transfers.flows.flows else
               f"{len(net.holds)} actors working" if net.holds else
               "no checkpoint directory" if not net.cfg.checkpoint_dir else None)
        if why:
            net.to_conductor("report", {"type": "checkpoint_skipped", "round": round_, "t": net.now, "why": why})
            return
        staging = net.cfg.checkpoint_dir + ".new"
        shutil.rmtree(staging, ignore_errors=True)
        os.makedirs(staging)
        self.round, self.failed = round_, []
        self.paused_at = time.monotonic()
        self.waiting = {p for p, actors in net.peer_actors.items() if p != CONDUCTOR and not set(actors) <= net.dead}
        limit = net.cfg.max_message_bytes
        chunk = max(MIN_PART_BYTES, limit // 2) if limit > 0 else 64 * MIN_PART_BYTES
        net.batches.flush(sock)  # the deliveries before it (quiet ones hold nothing) reach each peer first
        for peer in sorted(self.waiting):
            # a host on another machine cannot write into this run directory: it sends its part
            path = "" if peer in net.cfg.remote_peers else os.path.join(staging, f"{peer}.pkl")
            sock.send_multipart([peer.encode(), envelope.pack("snapshot", round=round_, path=path, chunk=chunk)])
        if not self.waiting:
            self._finish()

    def part(self, peer: str, frames: list[Any]) -> bool:
        """A piece of a remote host's part, appended to its file in the staging folder (in order:
        one peer's messages arrive in the order it sent them); False when none was asked of it."""
        if peer not in self.waiting or peer not in self.net.cfg.remote_peers:
            return False
        try:
            with open(os.path.join(self.net.cfg.checkpoint_dir + ".new", f"{peer}.pkl"), "ab") as f:
                for frame in frames:
                    f.write(frame.buffer if hasattr(frame, "buffer") else frame)
        except OSError as exc:  # a full disk must not end the run: the checkpoint is skipped
            self.failed.append(f"{peer}'s part: {type(exc).__name__}: {exc}")
        return True

    def answered(self, peer: str, ok: bool, why: str | None) -> bool:
        """A peer's part is written (or failed); False when it was not asked for one."""
        if peer not in self.waiting:
            return False
        self.waiting.discard(peer)
        if not ok:
            self.failed.append(why)
        if not self.waiting:
            self._finish()
        return True

    def peer_lost(self, peer: str) -> None:
        if peer in self.waiting:
            self.answered(peer, False, f"{peer} was lost")

    def _finish(self) -> None:
        net = self.net
        if net.clock.realtime_speedup and net.clock.wall_start is not None and self.paused_at is not None:
            # realtime: the emulated clock stood still while the peers wrote their parts; what is due
            # after the checkpoint is due that much later in wall time (not late: no lag is charged)
            net.clock.wall_start += time.monotonic() - self.paused_at
        self.paused_at = None
        staging = net.cfg.checkpoint_dir + ".new"
        if not self.failed:
            try:
                with open(os.path.join(staging, "network.pkl"), "wb") as f:
                    pickle.dump(self.state(), f, protocol=pickle.HIGHEST_PROTOCOL)
            except Exception as exc:  # a full disk must not end the run
                self.failed.append(f"network: {type(exc).__name__}: {exc}")
        if self.failed:
            shutil.rmtree(staging, ignore_errors=True)
            net.to_conductor("report", {"type": "checkpoint_skipped", "round": self.round, "t": net.now,
                                        "why": "; ".join(self.failed)})
        else:
            net.to_conductor("report", {"type": "checkpoint", "round": self.round, "t": net.now, "dir": staging})

    def state(self) -> dict[str, Any]:
        net = self.net
        return {**net.clock.state(), **net.transfers.state(), **net.timeline.state(),
                "hold_ids": peek(net, "hold_ids"), "dead": net.dead}

    def restore(self, path: str) -> None:
        net = self.net
        with open(path, "rb") as f:
            state = pickle.load(f)
        net.clock.restore(state)
        net.transfers.restore(state)
        net.timeline.restore(state)
        net.hold_ids = itertools.count(state["hold_ids"])
        net.dead.clear()
        net.dead.update(state["dead"])

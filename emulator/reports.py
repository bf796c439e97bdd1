"""What each report from a run's processes does to its results: one handler per report type, in
a dispatch table. The conductor receives the reports; this module turns them into round rows,
summary entries, incidents and checkpoints (through the run writer, emulator/results.py)."""
from __future__ import annotations

import json
import logging
import pickle
import shutil
import time
from pathlib import Path
from typing import Any, Callable

from .netconfig import SERVER
from .results import RunWriter

log = logging.getLogger(__name__)


class Reports:
    def __init__(self, conductor: Any):
        self.run = conductor  # the run's conductor: its view, ring rows, lobby, clock start and run directory
        self.last_shortfall: dict[str, Any] | None = None  # the last round that found too few eligible clients
        self.handlers: dict[str, Callable[[dict[str, Any], RunWriter], bool | None]] = {
            "round": self.round_row, "edge_round": lambda body, writer: writer.edge_round(body),
            "ring_round": self._ring_round, "ring_finished": self._ring_finished, "device": self._device,
            "cohort": self._cohort, "clock_started": self._clock_started,
            "privacy": lambda body, writer: writer.privacy_release(body), "error": self._incident,
            "rejected": self._incident, "no_eligible_clients": self._no_eligible_clients,
            "checkpoint": self._commit_checkpoint, "checkpoint_skipped": self._checkpoint_skipped,
            "refused_claim": self._refused_claim, "listening": self._listening,
            "refused_key": lambda body, writer: self.run._note_refusals([body], "network", writer),
            "network_stats": self._network_stats, "refused_messages": self._refused_messages,
            "finished": self._finished, "secagg_excluded": self._secagg_excluded, "secagg_failed": self._secagg_failed,
            "secagg_bad_share": self._secagg_bad_share,
        }

    def handle(self, body: dict[str, Any], writer: RunWriter) -> bool:
        """Apply one report; True when it says that the run is over."""
        handler = self.handlers.get(body.get("type"))
        return bool(handler(body, writer)) if handler is not None else False

    # ---- rounds ----------------------------------------------------------------------------------
    def round_row(self, body: dict[str, Any], writer: RunWriter) -> None:
        run = self.run
        wall = time.monotonic() - run.t0
        if run.startup_s is None:  # only if the clock_started report was missed
            run.startup_s = wall
        row = writer.round(body, wall)
        log.info("[conductor] round %s: %s of %s selected answered, t=%.3f s emulated (%.1f s wall)", row.get("round"),
                 row.get("completed"), row.get("selected"), float(row.get("t_end") or 0.0), wall)
        if body.get("lag"):
            writer.summary.lag(body["lag"], run.sc.clock.lag_bound_s)
        writer.write_summary("running", wall_time_s=wall)
        run.view.round(row, body.get("lag"))

    def _ring_round(self, body: dict[str, Any], writer: RunWriter) -> None:
        if self.run.ring is not None:
            for rep in self.run.ring.add(body):
                self.round_row(rep, writer)

    def _ring_finished(self, body: dict[str, Any], writer: RunWriter) -> bool:
        return self.run.ring is not None and self.run.ring.finish(body["client"])

    def _finished(self, body: dict[str, Any], writer: RunWriter) -> bool:
        if body.get("channels"):  # what the server's channels sent, by their own count
            writer.summary.channels(body["channels"])
        return True

    @staticmethod
    def _secagg_excluded(body: dict[str, Any], writer: RunWriter) -> None:
        writer.incident(f"secure aggregation, round {body['round']}, phase {body['phase']}: {body['client']} excluded: "
                        f"{body['why']}", client=body["client"], round=body["round"], phase=body["phase"])

    @staticmethod
    def _secagg_bad_share(body: dict[str, Any], writer: RunWriter) -> None:
        writer.incident(f"secure aggregation, round {body['round']}: {body['client']}'s share of {body['owner']}'s "
                        f"secret does not verify; the secret was rebuilt without it", client=body["client"],
                        round=body["round"], phase="unmask")

    @staticmethod
    def _secagg_failed(body: dict[str, Any], writer: RunWriter) -> None:
        why = f" ({body['why']})" if body.get("why") else ""
        writer.incident(f"secure aggregation, round {body['round']}: failed in phase {body['phase']} with {body['left']} "
                        f"left, threshold {body['threshold']}{why}", round=body["round"], phase=body["phase"],
                        left=body["left"], threshold=body["threshold"])

    def final_status(self, finished: dict[str, Any]) -> tuple[str, str | None]:
        """completed, unless no round ever had a client: then no_clients, saying what excluded them."""
        if finished.get("no_nodes"):  # a Flower app waited for nodes that never came
            return ("no_clients" if not finished.get("rounds_with_clients") else "failed"), finished["no_nodes"]
        if finished.get("reason"):  # the server gave up before its last round
            return "failed", finished["reason"]
        if finished.get("rounds_with_clients", 1) > 0:
            return "completed", None
        last = self.last_shortfall
        if last is None:
            return "no_clients", "no round had a client"
        failing = ", ".join(f"{v} fail selection.{k}" for k, v in last["failing"].items()) or "none failed a threshold"
        seen = (f"{last['checked_in']} of {last['population']} checked in" if last["checked_in"] is not None
                else f"{last['population'] - last['lost']} of {last['population']} reachable")
        return "no_clients", f"no round had an eligible client: {seen}; {failing} (last seen at round {last['round'] + 1})"

    # ---- the processes ---------------------------------------------------------------------------
    def _device(self, body: dict[str, Any], writer: RunWriter) -> None:
        info = {k: v for k, v in body.items() if k not in ("type", "peer", "t_net")}
        if writer.summary.training_device(body.get("peer"), info):
            # the CPU is what a run without a GPU uses anyway: only a GPU is news on the console
            self.run.view.note(f"{body.get('peer')} trains on {info.get('device')} ({info.get('name')})")

    def _cohort(self, body: dict[str, Any], writer: RunWriter) -> None:
        writer.summary.cohort(body.get("peer"), int(body.get("size", 0)))

    def _clock_started(self, body: dict[str, Any], writer: RunWriter) -> None:
        self.run.startup_s = time.monotonic() - self.run.t0

    def _network_stats(self, body: dict[str, Any], writer: RunWriter) -> None:
        writer.summary.network_stats(body)

    def _listening(self, body: dict[str, Any], writer: RunWriter) -> None:
        run = self.run
        if run.lobby is not None:
            writer.summary.network_listening(body.get("endpoint"))
            run._serve_lobby(writer, run.lobby.network_listening(str(body.get("endpoint"))))

    # ---- incidents -------------------------------------------------------------------------------
    def _incident(self, body: dict[str, Any], writer: RunWriter) -> None:
        kind = body["type"]
        writer.incident(kind, **{k: v for k, v in body.items() if k != "type"})
        self.run.view.last_incident = f"{kind}: {body.get('actor') or body.get('peer')}: {str(body.get('error'))[:80]}"

    def _no_eligible_clients(self, body: dict[str, Any], writer: RunWriter) -> None:
        self.last_shortfall = body
        fields = {k: v for k, v in body.items() if k not in ("type", "peer")}
        writer.incident("no_eligible_clients", **fields)
        failing = ", ".join(f"{v} fail {k}" for k, v in body["failing"].items())
        self.run.view.note(f"round {body['round'] + 1}: {body['eligible']} eligible of min {body['min_clients']} after waiting "
                           f"{body['waited_s']:.1f} s{' (' + failing + ')' if failing else ''}: {body['action']}")

    def _refused_claim(self, body: dict[str, Any], writer: RunWriter) -> None:
        writer.incident(f"refused a claim on actor names: {body.get('reason')}", peer=body.get("peer"),
                        emulated_time_s=body.get("t_net"))
        self.run.view.note(f"network refused a claim: {body.get('reason')}")

    def _refused_messages(self, body: dict[str, Any], writer: RunWriter) -> None:
        writer.summary.refused_messages(body)

    # ---- checkpoints -----------------------------------------------------------------------------
    def _checkpoint_skipped(self, body: dict[str, Any], writer: RunWriter) -> None:
        writer.summary.checkpoint_skipped(body["round"] + 1, body["why"])

    def _commit_checkpoint(self, body: dict[str, Any], writer: RunWriter) -> None:
        """The network and every peer have written their parts to the staging directory, and every
        record and report from before the checkpoint has reached us (they travel in order): add
        ours, then replace the previous checkpoint in one rename."""
        run_dir = self.run.run_dir
        staging = Path(body["dir"])
        final = run_dir / "checkpoint"
        rounds = len(writer.rows)
        if rounds != body["round"] + 1:  # cannot happen if reports travel in order; never write an inconsistent one
            writer.incident("checkpoint not written: the round rows do not match it", rows=rounds, round=body["round"])
            shutil.rmtree(staging, ignore_errors=True)
            return
        writer.summary.checkpoint_taken(rounds, body["t"], str(final))
        state = {"writer": writer.checkpoint_state(), "last_shortfall": self.last_shortfall, "ring": self.run.ring}
        with open(staging / "conductor.pkl", "wb") as f:
            pickle.dump(state, f, protocol=pickle.HIGHEST_PROTOCOL)
        holders = {SERVER: self.run.topology.server_actors(), **self.run.host_clients}
        holders = {peer: actors for peer, actors in holders.items() if (staging / f"{peer}.pkl").exists()}
        # parts that hosts on other machines sent: only a host ever loads them (resume_run)
        remote = sorted(p for p in holders if p in self.run.host_clients) if self.run.placement.remote else []
        (staging / "meta.json").write_text(json.dumps({"rounds": rounds, "emulated_time_s": body["t"], "actors": holders,
                                                       "remote_parts": remote}))
        old = run_dir / "checkpoint.old"
        shutil.rmtree(old, ignore_errors=True)
        if final.exists():
            final.rename(old)
        staging.rename(final)
        shutil.rmtree(old, ignore_errors=True)

"""The run directory, written as the run goes: after every round the files are complete."""
from __future__ import annotations

import csv
import json
import math
import os
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from node.accounting import Release, ledger_summary
from .device_log import SUMMARY_FIELDS, DeviceSummary
from .secure_results import SECURE_FIELDS, UPLOAD_KINDS, SecureTotals, phase_rows
from .summary import Summary, mean_of

SERVER = "server"

TRANSFER_FIELDS = ["id", "round", "kind", "src", "dst", "payload_bytes", "fp32_bytes", "wire_bytes", "link_bytes",
                   "t_start", "t_end", "outcome", "wasted_bytes"]
ROUND_FIELDS = ["round", "t_start", "t_end", "duration_s", "wall_s", "selected", "completed", "failed", "rejected",
                "payload_bytes_down", "payload_bytes_up", "payload_bytes_peer", "wire_bytes_down", "wire_bytes_up",
                "wire_bytes_peer", "fp32_bytes_down", "fp32_bytes_up", "fp32_bytes_peer", "payload_bytes_cloud",
                "wire_bytes_cloud", "fp32_bytes_cloud", "wasted_bytes", "bits_down",
                "bits_up_mean", "noise_scale_mean", "train_loss", "train_accuracy", "gamma", "timeouts", "staleness_mean",
                "staleness_max", "accuracy", "test_loss"]
CLIENT_FIELDS = ["round", "client", "outcome", "samples", "checkin_t", "battery", "charging", "cpu_load", "link", "selected_t",
                 "download_start", "download_end", "compute_start", "compute_end", "upload_start", "upload_end",
                 "gossip_start", "gossip_end",
                 "payload_bytes_down", "payload_bytes_up", "energy_j", "bits_down", "bits_up", "nu", "loss",
                 "lipschitz", "sensitivity", "noise_scale", "update_norm", "dp_epsilon", "dp_epsilon_total", "staleness", "aggregator", "edge_round"]
DEVICE_FIELDS = ["t", "client", "event", "battery", "energy_j"]
# topology hierarchical: one row per edge round (tier client: the edge and its clients) and per edge
# and cloud round (tier cloud: the edge's exchange with the cloud)
EDGE_FIELDS = ["round", "edge", "tier", "edge_round", "t_start", "t_end", "duration_s", "selected", "completed", "failed",
               "rejected", "train_loss", "payload_bytes_down", "payload_bytes_up", "wire_bytes_down", "wire_bytes_up"]
# why a selected client sent nothing, from what happened to its device during the round
DROP_REASONS = {"battery": "dropped_battery", "offline": "dropped_offline", "link_down": "dropped_link_down"}


def train_loss(rows: list[dict], arrivals: list[str] | None = None) -> float | None:
    """A round's training loss: the mean of its on-time updates' losses, summed in the order the
    server took them (`arrivals`; an asynchronous step's rows are in that order already)."""
    ok = [r for r in rows if r["outcome"] == "ok" and r.get("loss") is not None]
    if arrivals is not None:
        rank = {name: i for i, name in enumerate(arrivals)}
        ok.sort(key=lambda r: rank.get(r["client"], len(rank)))
    return float(np.mean([r["loss"] for r in ok])) if ok else None


def write_json_atomic(path: Path, data: Any) -> None:
    """`path` replaced whole or not at all: a full disk leaves the previous file, and no part file."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    try:
        tmp.write_text(json.dumps(data, indent=2, sort_keys=False))
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise


CSV_FILES = {"transfers": TRANSFER_FIELDS, "rounds": ROUND_FIELDS, "clients": CLIENT_FIELDS, "devices": DEVICE_FIELDS}
# what a checkpoint keeps of the writer besides the lengths of its CSV files
WRITER_STATE = ("device_events", "outcomes", "unassigned", "rows", "incidents", "summary", "releases", "diagnostics",
                "secure_totals", "dispatch_timing", "device_summary")
# a client's diagnostics kept for this many of its latest updates (an update's row may be written a few
# rounds after it arrived, when a late update joins a later round)
DIAGNOSTICS_KEPT = 8


class RunWriter:
    def __init__(self, run_dir: Path, scenario: dict, population_rows: list[dict], resume: dict | None = None,
                 aggregators: list[str] = ()):
        """resume: a checkpoint's writer state; the CSV files are cut back to their lengths then.
        aggregators: a hierarchy's edge aggregators (their rounds go to edges.csv)."""
        self.dir = run_dir
        self.dir.mkdir(parents=True, exist_ok=True)
        if resume is None:
            (self.dir / "scenario.yaml").write_text(yaml.safe_dump(scenario, sort_keys=False))
            with open(self.dir / "population.csv", "w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=list(population_rows[0]))
                w.writeheader()
                w.writerows(population_rows)
        # devices.csv: a row per device and round (DeviceSummary), or the event log (run.device_log: full)
        self.device_summary = None if (scenario.get("run") or {}).get("device_log") == "full" else DeviceSummary()
        for name, fields in CSV_FILES.items():
            if name == "devices" and self.device_summary is not None:
                fields = SUMMARY_FIELDS
            handle, writer = self._open_csv(name, fields, resume)
            setattr(self, f"_{name}_file", handle)
            setattr(self, f"_{name}", writer)
        self.aggregators = set(aggregators)
        self._secure_file = self._secure = None
        if ((scenario.get("algorithm") or {}).get("secure_aggregation") or {}).get("protocol", "none") != "none":
            self._secure_file, self._secure = self._open_csv("secure", SECURE_FIELDS, resume)
        self.secure_totals = SecureTotals()
        self.edge_reports: list[dict] = []  # edge rounds since the last cloud round
        self._edges_file = self._edges = None
        if self.aggregators:
            self._edges_file, self._edges = self._open_csv("edges", EDGE_FIELDS, resume)
        self.device_events: dict[str, list[dict]] = defaultdict(list)
        self.outcomes: dict[str, int] = defaultdict(int)
        self.unassigned: list[dict] = []  # transfer records not yet counted in a round
        self.rows: list[dict] = []
        self.incidents: list[dict] = []
        self.summary = Summary.start(scenario.get("name"))
        self.target = (scenario.get("eval") or {}).get("target_accuracy")
        self.releases: dict[str, list[Release]] = defaultdict(list)  # every noised message each client sent
        self._composed: dict[str, tuple[int, dict]] = {}  # ledger_summary's totals per client, kept between summaries
        # asynchronous runs: task/update timing per (dispatch, client) until the step that concludes it
        self.dispatch_timing: dict[tuple[int, str], dict[str, Any]] = {}
        # per client, per round (an asynchronous run's dispatch) of an update: the diagnostics its
        # sender recorded beside it (loss, nu, lambda, noise, epsilon), which the server never sees
        self.diagnostics: dict[str, dict[int, dict[str, Any]]] = defaultdict(dict)
        self.accounting_delta = ((scenario.get("algorithm") or {}).get("privacy") or {}).get("accounting_delta", 1e-5)
        if resume is not None:
            for name in WRITER_STATE:
                if name in resume:  # a checkpoint of an earlier version may lack the newer ones
                    setattr(self, name, resume[name])
            self.summary = Summary(self.summary)
        # what a salvage cuts the CSV files and the rows back to (emulator/conductor.py)
        self._whole, self._whole_rows = self._sizes(), len(self.rows)

    def _open_csv(self, name: str, fields: list[str], resume: dict | None):
        """One of the run's CSV files (and its writer): new with its header, or on resume cut back
        to the checkpoint's length and appended to."""
        path = self.dir / f"{name}.csv"
        if resume is not None:
            with open(path, "r+b") as f:
                f.truncate(resume["csv_bytes"][name])
        handle = open(path, "a" if resume is not None else "w", newline="")
        writer = csv.DictWriter(handle, fieldnames=fields)
        if resume is None:
            writer.writeheader()
            handle.flush()
        return handle, writer

    def checkpoint_state(self) -> dict:
        """Everything needed to go on writing this run as if it had never stopped."""
        sizes = {}
        for name in CSV_FILES:
            handle = getattr(self, f"_{name}_file")
            handle.flush()
            sizes[name] = os.fstat(handle.fileno()).st_size
        for name, handle in (("secure", self._secure_file), ("edges", self._edges_file)):
            if handle is not None:
                handle.flush()
                sizes[name] = os.fstat(handle.fileno()).st_size
        return {"csv_bytes": sizes, **{name: getattr(self, name) for name in WRITER_STATE}}

    def privacy_release(self, rep: dict) -> None:
        rdp = rep.get("rdp")
        self.releases[rep["actor"]].append(Release(rep["what"], rep["mechanism"], rep["epsilon"], rep["delta"], rep["rho"],
                                                   tuple(rdp) if rdp else None, rep.get("guarantee", "proven"),
                                                   rep.get("adjacency", "substitution")))

    def transfer(self, rec: dict) -> None:
        notes = rec.pop("notes", None)
        if notes and rec["outcome"] == "ok":
            kept = self.diagnostics[rec["src"]]
            kept[rec["round"]] = notes
            if len(kept) > DIAGNOSTICS_KEPT:
                del kept[min(kept)]
        self._transfers.writerow(rec)
        self.unassigned.append(rec)

    def _take_transfers(self, t_end: float, by_round: int | None = None, through_round: int | None = None) -> list[dict]:
        """The transfers that ended by t_end. The network reports every one of them before the
        report of a round that ends at t_end; later ones may or may not have arrived yet, so they
        wait for the next round. Rounds therefore account for what crossed the network during
        them, and a run's rows are the same on every machine.

        The next round begins at the instant this one ends, and a transfer of it can end at that
        same instant (a task to a device found offline ends as it starts): with `through_round`,
        one labelled with a later round waits for its own, whether or not it reached the conductor
        before this round's report did.

        A ring's rounds overlap in time (a client may start the next round while a slower one
        still gossips), so there a round takes the transfers labelled with it (or earlier) that
        ended by its end: a gossip message still in flight when its round ended (a neighbour had
        timed out and gone on) belongs to the round in which it arrives. Without the time bound it
        went to one round or the next by the order in which its record and the clients' reports
        reached the conductor (the reports travel on a thread of their own), and two runs of the
        same seed could write different rows."""
        if by_round is not None:
            mine = lambda r: r["round"] <= by_round and r["t_end"] <= t_end  # noqa: E731
        elif through_round is not None:
            mine = lambda r: r["t_end"] <= t_end and r["round"] <= through_round  # noqa: E731
        else:
            mine = lambda r: r["t_end"] <= t_end  # noqa: E731
        taken = [r for r in self.unassigned if mine(r)]
        self.unassigned = [r for r in self.unassigned if not mine(r)]
        return taken

    def _direction(self, src: str, dst: str) -> str:
        """cloud: between the cloud and an edge; down and up: from and to a client's server (the
        server, or its edge); peer: between clients."""
        servers = self.aggregators | {SERVER}
        if src in servers and dst in servers:
            return "cloud"
        return "down" if src in servers else "up" if dst in servers else "peer"

    def _sums(self, transfers: list[dict]) -> dict[str, int]:
        sums: dict[str, int] = defaultdict(int)
        for rec in transfers:
            direction = self._direction(rec["src"], rec["dst"])
            if rec["outcome"] == "ok":
                for kind in ("payload", "wire", "fp32"):
                    sums[f"{kind}_bytes_{direction}"] += rec[f"{kind}_bytes"]
            sums["wasted_bytes"] += rec.get("wasted_bytes", 0)
        return sums

    def _client_timing(self, transfers: list[dict], round_index: int | None,
                       timing: dict | None = None) -> dict[Any, dict[str, Any]]:
        """Download and upload times and bytes per client of round `round_index`; with None, per
        (round, client) of every round, added to `timing`."""
        timing = {} if timing is None else timing
        for rec in transfers:
            if (round_index is not None and rec["round"] != round_index) or rec["kind"] not in ("task", *UPLOAD_KINDS):
                continue
            down = rec["src"] == SERVER or (rec["src"] in self.aggregators and rec["dst"] != SERVER)
            phase, direction, client = ("download", "down", rec["dst"]) if down else ("upload", "up", rec["src"])
            entry = timing.setdefault(client if round_index is not None else (rec["round"], client), {})
            entry[f"{phase}_start"] = rec["t_start"]
            if rec["outcome"] == "ok":
                entry[f"{phase}_end"] = rec["t_end"]
                entry[f"payload_bytes_{direction}"] = rec["payload_bytes"]
            else:
                entry["lost"] = rec["outcome"]
        return timing

    def device(self, rec: dict) -> None:
        if self.device_summary is None:
            self._devices.writerow({k: rec.get(k) for k in DEVICE_FIELDS})
        else:
            self._devices.writerows(self.device_summary.add(rec))
        self.device_events[rec["client"]].append(rec)

    def round(self, rep: dict, wall_s: float) -> dict:
        account = rep.get("account")
        if account == "round":
            taken = self._take_transfers(rep["t_end"], by_round=rep["round"])
        elif account is None and not self.aggregators:  # a synchronous server's round
            taken = self._take_transfers(rep["t_end"], through_round=rep["round"])
        else:
            taken = self._take_transfers(rep["t_end"])
        sums = self._sums(taken)
        if self.aggregators:  # the cloud's clients are the edges; the client rows come from the edge rounds
            clients, edge_rows = self._hierarchy_rows(rep, taken)
        elif rep.get("account") == "dispatch":  # a client row is one dispatch, whose transfers may span steps
            self._client_timing(taken, None, self.dispatch_timing)
            clients = [self._client_row(rep, c, self.dispatch_timing.pop((c["dispatch"], c["client"]), {}))
                       for c in rep.get("clients", [])]
        else:
            timing = self._client_timing(taken, rep["round"])
            clients = [self._client_row(rep, c, timing.get(c["client"], {})) for c in rep.get("clients", [])]
        for c in clients:
            self.outcomes[c["outcome"]] += 1
        keep_since = rep.get("keep_since", rep["t_start"])
        for name in list(self.device_events):  # only this round's events (or a running dispatch's) can still matter
            self.device_events[name] = [e for e in self.device_events[name] if e["t"] >= keep_since]
        ok = [c for c in clients if c["outcome"] == "ok"]
        if not self.aggregators and "train_loss" not in rep:  # the server does not know it: its clients' records do
            rep = {**rep, "train_loss": train_loss(clients, rep.get("arrivals"))}
        mean = lambda key: (sum(c[key] for c in ok) / len(ok)) if ok and all(c.get(key) is not None for c in ok) else None  # noqa: E731
        row = {
            "round": rep["round"], "t_start": rep["t_start"], "t_end": rep["t_end"],
            "duration_s": rep["t_end"] - rep["t_start"], "wall_s": wall_s,
            **{k: rep.get(k) for k in ("selected", "completed", "failed", "rejected", "train_loss", "accuracy", "test_loss",
                                       "bits_down", "train_accuracy", "gamma", "timeouts", "staleness_mean",
                                       "staleness_max")},
            "bits_up_mean": mean("bits_up"), "noise_scale_mean": mean("noise_scale"),
            **{f: sums.get(f, 0) for f in ROUND_FIELDS if "bytes" in f},
        }
        if self.aggregators:  # a hierarchy's round counts its clients, not its edges
            losses = [c["loss"] for c in ok if c.get("loss") is not None]
            row.update(selected=len(clients), completed=len(ok), failed=len(clients) - len(ok),
                       rejected=sum(e.get("rejected") or 0 for e in edge_rows if e["tier"] == "client"),
                       train_loss=sum(losses) / len(losses) if losses else None)
            self._edges.writerows(edge_rows)
            self._edges_file.flush()
        if rep.get("secure") is not None and self._secure is not None:
            self._secure_rows(rep, taken, SERVER)
        self.rows.append(row)
        self._rounds.writerow(row)
        self._clients.writerows(clients)
        if self.device_summary is not None:
            self._devices.writerows(self.device_summary.round_ended(row["round"], row["t_end"]))
        for f in (self._rounds_file, self._transfers_file, self._clients_file, self._devices_file):
            f.flush()
        self._whole, self._whole_rows = self._sizes(), len(self.rows)
        return row

    def _secure_rows(self, rep: dict, taken: list[dict], server: str) -> None:
        phases = phase_rows(rep, taken, server)
        self.secure_totals.add(rep, phases)
        self._secure.writerows(phases)
        self._secure_file.flush()

    def edge_round(self, rep: dict) -> None:
        """An edge round of a hierarchy: kept until the cloud round it belongs to is written."""
        self.edge_reports.append(rep)

    def _pair_bytes(self, transfers: list[dict], round_index: int, server: str, peer: str | None = None) -> dict[str, int]:
        """Bytes in round `round_index` between `server` and `peer` (None: its clients): down from it, up to it."""
        servers = self.aggregators | {SERVER}
        out = {f"{kind}_bytes_{d}": 0 for kind in ("payload", "wire") for d in ("down", "up")}
        for rec in transfers:
            if rec["round"] != round_index or rec["outcome"] != "ok" or server not in (rec["src"], rec["dst"]):
                continue
            other = rec["dst"] if rec["src"] == server else rec["src"]
            if (other != peer) if peer is not None else (other in servers):
                continue
            d = "down" if rec["src"] == server else "up"
            out[f"payload_bytes_{d}"] += rec["payload_bytes"]
            out[f"wire_bytes_{d}"] += rec["wire_bytes"]
        return out

    def _hierarchy_rows(self, rep: dict, taken: list[dict]) -> tuple[list[dict], list[dict]]:
        """The client rows of every edge round of this cloud round, and the rows of edges.csv: one
        per edge round (tier client) and one per edge's exchange with the cloud (tier cloud)."""
        timing = self._client_timing(taken, None)
        clients, edge_rows = [], []
        reports, self.edge_reports = self.edge_reports, []
        for er in reports:
            if er.get("secure") is not None and self._secure is not None:  # an edge's own secure aggregation
                self._secure_rows(er, taken, er["edge"])
            mine = [self._client_row(er, c, timing.get((er["round"], c["client"]), {})) for c in er.get("clients", [])]
            for row in mine:
                row.update(round=rep["round"], edge_round=er["round"], aggregator=er["edge"])
            clients.extend(mine)
            edge_rows.append({"round": rep["round"], "edge": er["edge"], "tier": "client", "edge_round": er["round"],
                              "t_start": er["t_start"], "t_end": er["t_end"], "duration_s": er["t_end"] - er["t_start"],
                              **{k: er.get(k) for k in ("selected", "completed", "failed", "rejected")},
                              "train_loss": train_loss(mine, er.get("arrivals")),
                              **self._pair_bytes(taken, er["round"], er["edge"])})
        for c in rep.get("clients", []):
            edge = c["client"]
            t = timing.get((rep["round"], edge), {})
            mine = self._pair_bytes(taken, rep["round"], SERVER, edge)
            start, end = t.get("download_start"), t.get("upload_end")
            edge_rows.append({"round": rep["round"], "edge": edge, "tier": "cloud", "t_start": start, "t_end": end,
                              "duration_s": end - start if start is not None and end is not None else None,
                              "selected": 1, "completed": int(c.get("outcome") == "ok"),
                              "failed": int(c.get("outcome") != "ok"), **mine})
        return clients, edge_rows

    def _client_row(self, rep: dict, reported: dict, timing: dict) -> dict:
        lost = timing.pop("lost", None)
        row = {key: None for key in CLIENT_FIELDS}
        row.update(round=rep["round"], bits_down=rep.get("bits_down"), **timing)
        row.update({k: v for k, v in reported.items() if k in CLIENT_FIELDS})
        row.update({k: v for k, v in self._diagnostics_of(rep, reported).items() if k in CLIENT_FIELDS})
        row["bits_up"] = reported.get("bits")
        status = reported.get("status") or {}
        row.update(checkin_t=reported.get("checkin_t"), battery=status.get("battery"), charging=status.get("charging"),
                   cpu_load=status.get("cpu_load"),
                   link=status.get("link"), selected_t=reported.get("selected_t", rep["t_start"]))
        if row.get("download_end") is not None and row.get("compute_start") is None:
            row["compute_start"] = row["download_end"]
        if row.get("upload_start") is not None:
            row["compute_end"] = row["upload_start"]
        events = [e for e in self.device_events.get(reported["client"], []) if row["selected_t"] <= e["t"] <= rep["t_end"]]
        row["energy_j"] = sum(e.get("energy_j") or 0.0 for e in events)
        if row["outcome"] == "no_update":
            # Dropped if its device or link failed during the round; late if it had its task and was
            # still working when the round closed (its update, if it comes, is discarded).
            reason = DROP_REASONS.get(lost) or next((DROP_REASONS[e["event"]] for e in events if e["event"] in DROP_REASONS), None)
            row["outcome"] = reason or ("late" if row.get("download_end") is not None else "no_update")
        return row

    def _diagnostics_of(self, rep: dict, reported: dict) -> dict[str, Any]:
        """What the client recorded beside the update this row is about: of the dispatch (an
        asynchronous run), or of the round it was trained for (a late update joins a later one).
        Only an update the server took has them: one that came after its round closed may or may
        not have reached the records before the round's row, whichever process was quicker."""
        if "samples" not in reported:  # the server's record of an update it took (node/server.py's CLIENT_FIELDS)
            return {}
        origin = reported["dispatch"] if "dispatch" in reported else rep["round"] - (reported.get("staleness") or 0)
        return self.diagnostics.get(reported["client"], {}).get(origin, {})

    def incident(self, what: str, **details: Any) -> None:
        self.incidents.append({"what": what, **details})

    def write_summary(self, status: str, **extra: Any) -> dict:
        """summary.json as it stands: what it was told, with the totals of the rows so far."""
        self.summary.conclude(
            status, self.rows, self.target, outcomes=self.outcomes, incidents=self.incidents,
            privacy_spent=lambda: ledger_summary(self.releases, self.accounting_delta, self._composed) if self.releases else None,
            **extra)
        if self.secure_totals.state["rounds"]:
            self.summary["secure_aggregation"] = self.secure_totals.summary(self.rows)
        write_json_atomic(self.dir / "summary.json", self.summary)
        return self.summary

    def _handles(self) -> list:
        """Every CSV file this run writes (edges.csv and secure.csv where it has them)."""
        return [f for f in (self._transfers_file, self._rounds_file, self._clients_file, self._devices_file,
                            self._edges_file, self._secure_file) if f is not None]

    def _sizes(self) -> dict[Path, int]:
        """Each CSV file's size, all of it flushed: what a salvage cuts back to."""
        return {Path(f.name): f.tell() for f in self._handles() if not f.closed}

    def salvage(self) -> None:
        """After a write failed (a full disk): close every file and cut each CSV back to what it held
        after the last round written whole, so every file left is readable (no half row)."""
        whole = self._whole
        for f in self._handles():
            if f.closed:
                continue
            try:
                f.close()
            except OSError:
                pass  # its buffer could not be written: the cut below drops what did
        for path, size in whole.items():
            if path.exists() and path.stat().st_size > size:
                os.truncate(path, size)
        self.rows = self.rows[:self._whole_rows]  # the summary counts what the files hold
        self._whole = {}  # a second salvage (the summary's write failed too) cuts nothing more

    def close(self) -> None:
        if self.device_summary is not None and not self._devices_file.closed:
            try:  # the rounds still held, and what the devices did after the last one
                self._devices.writerows(self.device_summary.close())
            except OSError:
                pass  # a full disk: the file keeps the rows it holds
        for f in self._handles():
            if not f.closed:
                f.close()


class RingRounds:
    """Round rows of a serverless run. Nobody sees a ring's round end: each client reports its own
    (with its accuracy on its own test split). Round r of the run ends when the last live client
    has finished it; its row has the mean of the clients' figures."""

    def __init__(self, clients: list[str]):
        self.expected = set(clients)
        self.pending: dict[int, dict[str, dict]] = defaultdict(dict)
        self.next_round = 0
        self.finished: set[str] = set()

    def add(self, rep: dict) -> list[dict]:
        self.pending[rep["round"]][rep["client"]] = rep
        return self._ready()

    def lose(self, clients: list[str]) -> list[dict]:
        self.expected -= set(clients)
        return self._ready()

    def finish(self, client: str) -> bool:
        self.finished.add(client)
        return bool(self.expected) and self.expected <= self.finished

    def _ready(self) -> list[dict]:
        rows = []
        while self.expected and self.expected <= set(self.pending.get(self.next_round, {})):
            # in client order, not arrival order: float sums depend on their order, and a run must
            # be a function of its seed (two runs once differed in the 17th digit of test_loss)
            reps = sorted(self.pending.pop(self.next_round).values(), key=lambda r: r["client"])
            rows.append(self._merge(self.next_round, reps))
            self.next_round += 1
        return rows

    def _merge(self, index: int, reps: list[dict]) -> dict:
        mean = lambda key: mean_of(r.get(key) for r in reps)  # noqa: E731
        accuracies = [r.get("accuracy") for r in reps]
        return {
            "type": "round", "round": index, "account": "round",
            "t_start": min(r["t_start"] for r in reps), "t_end": max(r["t_end"] for r in reps),
            "selected": len(reps), "completed": len(reps), "failed": 0, "rejected": 0,
            "train_loss": mean("loss"), "train_accuracy": mean("train_accuracy"), "gamma": mean("gamma"),
            "timeouts": sum(r.get("timeouts", 0) for r in reps),
            "accuracy": mean_of(accuracies) if all(a is not None for a in accuracies) else None,
            "test_loss": mean("test_loss"), "lag": max(reps, key=lambda r: r["t_end"]).get("lag"),
            "clients": [{"client": r["client"], "outcome": "ok", "samples": r.get("samples"), "loss": r.get("loss"),
                         "compute_start": r["t_start"], "compute_end": r.get("compute_end"),
                         "gossip_start": r.get("compute_end"), "gossip_end": r["t_end"]}
                        for r in reps],
        }



def fmt_bytes(n: float) -> str:
    if n <= 0:
        return "0 B"
    units = ["B", "KiB", "MiB", "GiB", "TiB"]
    i = min(len(units) - 1, int(math.log(n, 1024)))
    return f"{n / 1024**i:.1f} {units[i]}"

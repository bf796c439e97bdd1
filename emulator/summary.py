"""What summary.json says, assembled in one place. Every entry is set by one method here: the
conductor describes the run and its placement, the report handlers (emulator/reports.py) add what
the processes tell, and the run writer (emulator/results.py) concludes it with the totals of its
round rows each time it writes the file. The table of summary.json in docs/guide/running.md is this module's."""
from __future__ import annotations

from typing import Any, Callable, Iterable

GIB = 2**30


def mean_of(values: Iterable[Any]) -> float | None:
    """The mean of the values that are not None (None when there are none)."""
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None


class Summary(dict):
    """summary.json as a mapping (what is read of it reads as before); written only through these
    methods."""

    @classmethod
    def start(cls, scenario_name: str | None) -> "Summary":
        return cls(scenario=scenario_name, status="running")

    # ---- the conductor: the run as it starts ----------------------------------------------------
    def describe_run(self, sc: Any, privacy: Any, codec_time: dict | None, topology_entries: dict[str, Any]) -> None:
        """The privacy mechanism, the topology (and what it adds), the measured codec times, the clock."""
        epsilon = None if privacy.epsilon == float("inf") else privacy.epsilon
        core = privacy.mechanism in ("laplace", "gaussian")
        self["privacy"] = {"mechanism": privacy.mechanism, "epsilon": epsilon, "delta": privacy.delta, "clip": privacy.clip,
                           "noise_factor_c_T": privacy.factor,
                           "horizon": sc.algorithm.privacy.horizon or sc.rounds,  # the T of c_T
                           "epsilon_per_release": epsilon / privacy.factor if core and epsilon and privacy.factor else None,
                           "compute_factor": privacy.compute_factor,  # its sessions' time relative to plain SGD
                           # what the core mechanisms' noise is calibrated to (paper: a heuristic; worst_case: a bound)
                           "calibration": privacy.calibration if core else None,
                           # DP-SGD: the neighbouring data sets its bound is about (node/stages.py)
                           "adjacency": {"poisson": "add_remove", "shuffle": "zero_out"}.get(privacy.sampling)
                           if privacy.mechanism == "dpsgd" else None}
        q = sc.algorithm.quantization
        self["quantization"] = {"schedule": q.schedule, "horizon": q.horizon or sc.rounds}  # the T of the cosine
        self["topology"] = sc.topology
        if codec_time is not None:
            self["codec_time"] = codec_time
        self.update(topology_entries)
        clock = sc.clock
        self["clock"] = {"mode": clock.mode, **({"speedup": clock.speedup, "lag_bound_s": clock.lag_bound_s}
                                                if clock.mode == "realtime" else {})}

    def resumed_from(self, rounds: int) -> None:
        self.setdefault("resumed", []).append({"from_round": rounds,
                                               "emulated_time_s": self["checkpoint"]["emulated_time_s"]})

    def placement(self, launcher: str, hosts: int, lobby: str) -> None:
        self["placement"] = {"launcher": launcher, "hosts": hosts, "lobby": lobby, "joined": {}}

    def host_joined(self, host: str, address: str) -> bool:
        """False when it was known already."""
        joined = self["placement"]["joined"]
        if host in joined:
            return False
        joined[host] = address
        return True

    def network_listening(self, endpoint: Any) -> None:
        self["placement"]["network"] = endpoint

    def stopped_by(self, signum: int) -> None:
        self["signal"] = int(signum)

    # ---- what the processes report ---------------------------------------------------------------
    def lag(self, lag: dict, bound_s: float) -> None:
        """Realtime mode: how far the clock fell behind, and whether the run stayed faithful."""
        self["clock"]["lag"] = lag
        self["clock"]["faithful"] = lag["max_s"] <= bound_s

    def channels(self, channels: dict) -> None:
        self["channels"] = channels

    def training_device(self, peer: str, info: dict) -> bool:
        """A host's training device; True when it is a GPU not seen before (news for the console)."""
        devices = self.setdefault("training_devices", {})
        news = info.get("device") != "cpu" and not any(d.get("device") == info.get("device") for d in devices.values())
        devices[peer] = info
        return news

    def cohort(self, peer: str, size: int) -> None:
        cohorts = self.setdefault("cohorts", {}).setdefault(peer, {"groups": 0, "clients": 0, "largest": 0})
        cohorts.update(groups=cohorts["groups"] + 1, clients=cohorts["clients"] + size, largest=max(cohorts["largest"], size))

    def network_stats(self, body: dict) -> None:
        clock_s = body.get("clock_s") or 0.0
        self["network"] = {"events": body.get("events"), "cpu_s": body.get("cpu_s"), "clock_s": clock_s,
                           "events_per_s": body["events"] / clock_s if clock_s > 0 else None,
                           "waited_s": body.get("waited_s") or {}}

    def refused_messages(self, body: dict) -> None:
        self["refused_messages"] = {k: body.get(k) for k in ("total", "by_peer", "banned")}

    def checkpoint_skipped(self, after_round: int, why: str) -> None:
        info = self.setdefault("checkpoint", {})
        info["skipped"] = info.get("skipped", 0) + 1
        info["last_skip"] = {"after_round": after_round, "why": why}

    def checkpoint_taken(self, rounds: int, emulated_time_s: float, where: str) -> None:
        self.setdefault("checkpoint", {}).update(rounds=rounds, emulated_time_s=emulated_time_s, dir=where)

    def checkpoint_removed(self) -> None:
        """A completed run keeps no checkpoint: nothing is left to resume."""
        self.get("checkpoint", {}).pop("dir", None)

    # ---- the run writer: the totals of its rows, each time it writes -------------------------------
    def conclude(self, status: str, rows: list[dict], target: float | None, privacy_spent: Callable[[], Any],
                 outcomes: dict[str, int], incidents: list[dict], **extra: Any) -> None:
        total = lambda key: sum(r[key] for r in rows)  # noqa: E731
        evaluated = [r for r in rows if r.get("accuracy") is not None]
        best = max(evaluated, key=lambda r: r["accuracy"], default=None)
        reached = next((r for r in evaluated if target and r["accuracy"] >= target), None)
        fp32 = total("fp32_bytes_up") + total("fp32_bytes_down") + total("fp32_bytes_peer") + total("fp32_bytes_cloud")
        payload = total("payload_bytes_up") + total("payload_bytes_down") + total("payload_bytes_peer") + total("payload_bytes_cloud")
        self.update({
            "status": status,
            "rounds_completed": len(rows),
            "emulated_time_s": rows[-1]["t_end"] if rows else 0.0,
            "best_accuracy": best["accuracy"] if best else None,
            "best_accuracy_round": best["round"] if best else None,
            "final_accuracy": evaluated[-1]["accuracy"] if evaluated else None,
            "target_accuracy": target,
            "time_to_target_s": reached["t_end"] if reached else None,
            "payload_gib_up": total("payload_bytes_up") / GIB,
            "payload_gib_down": total("payload_bytes_down") / GIB,
            "payload_gib_peer": total("payload_bytes_peer") / GIB,
            "payload_bytes_peer": total("payload_bytes_peer"),
            "payload_bytes_cloud": total("payload_bytes_cloud"),
            "wire_bytes_cloud": total("wire_bytes_cloud"),
            "wire_bytes_peer": total("wire_bytes_peer"),
            "wire_gib_up": total("wire_bytes_up") / GIB,
            "wire_gib_down": total("wire_bytes_down") / GIB,
            "payload_bytes_up": total("payload_bytes_up"),
            "payload_bytes_down": total("payload_bytes_down"),
            "wire_bytes_up": total("wire_bytes_up"),
            "wire_bytes_down": total("wire_bytes_down"),
            "wasted_bytes": total("wasted_bytes"),
            "saving_vs_fp32": (1 - payload / fp32) if fp32 else None,
            "mean_bits_down": mean_of(r.get("bits_down") for r in rows),
            "mean_bits_up": mean_of(r.get("bits_up_mean") for r in rows),
            "mean_noise_scale": mean_of(r.get("noise_scale_mean") for r in rows),
            "privacy_spent": privacy_spent(),
            "client_outcomes": dict(outcomes),
            "client_updates_ok": total("completed"),
            "client_updates_failed": total("failed"),
            "incidents": incidents,
            **extra,
        })

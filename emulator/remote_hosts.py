"""The conductor's side of hosts on other machines: the lobby they join through (with the ray
launcher, the Ray tasks that run them), what it tells the run's log and summary, and Ray's end."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import zmq

from protocol.curve import read_host_key
from .placement import (DEFAULT_SILENCE_S, Child, DataRefused, Lobby, PlacementError, RemoteHost, data_shard,
                        ray_hosts, slot_keys, world_fingerprint)
from .results import RunWriter
from .world import World, scenario_files, splits_by_user


class RemoteHosts:
    """A mixin of the Conductor (emulator/conductor.py), whose attributes it uses: sc, resolved,
    placement, view, children, host_clients, and, for a resumed run, saved_parts."""
    lobby: Any = None
    ray_started = False

    def _open_lobby(self, ctx: zmq.Context, world: World, listen: str, run_keys, key_files: list[Path],
                    writer: RunWriter) -> None:
        """Open the lobby and, with the ray launcher, start the hosts that will join through it."""
        names = sorted(self.host_clients, key=lambda n: int(n.removeprefix("host")))
        bound = slot_keys(run_keys, names)
        timeout = self.sc.run.peer_timeout_s
        welcome = {"scenario": self.resolved, "fingerprint": world_fingerprint(world),
                   "silence_s": float(timeout if timeout is not None else DEFAULT_SILENCE_S)}
        def parts_of(slot: str) -> list[bytes]:  # a resumed run: the checkpoint parts that hold the slot's clients
            return [Path(p).read_bytes() for p in self.saved_parts(self.host_clients[slot])]
        restore_for = parts_of if self.resuming else None
        data_for = self._data_server(world)
        welcome["files"], files = self._scenario_files()
        if self.placement.launcher == "ray":  # (without --keys: Placement.check)
            self.lobby = Lobby(ctx, listen, run_keys, [], welcome, bound, restore_for, data_for, files)
            # each task is handed its slot's host key, made for this run, as its argument
            keys, threads = [read_host_key(p) for p in key_files], max(1, int(self.placement.cpus_per_host))
            self.ray_started, procs = ray_hosts(self.placement, names, self.lobby.address_for_hosts(), keys, threads)
            self.lobby.add(procs)
        else:
            procs = [RemoteHost(name) for name in names]
            self.lobby = Lobby(ctx, listen, run_keys, list(procs), welcome, bound, restore_for, data_for, files)
            self.view.note(self.lobby.waiting_note(len(names), key_files))
        for proc in procs:
            self.children.append(Child(proc.name, "host", proc))
        writer.summary.placement(self.placement.launcher, len(names), self.lobby.endpoint)

    def _serve_lobby(self, writer: RunWriter, notes: list[str] | None = None) -> None:
        for line in notes if notes is not None else self.lobby.receive():
            self.view.note(line)
        for child in self.children:
            if isinstance(child.proc, RemoteHost) and child.proc.joined_from:
                writer.summary.host_joined(child.name, child.proc.joined_from)
        self._note_refusals(self.lobby.refusals(), "conductor", writer)

    def _note_refusals(self, refusals: list[dict], by: str, writer: RunWriter) -> None:
        for r in refusals:
            writer.incident(f"refused a connection to the {by}: {r['why']}", address=r.get("address"), key=r.get("key"))
            self.view.note(f"{by} refused a connection from {r.get('address')}: {r['why']}")

    def _release_launcher(self) -> None:
        if self.placement.launcher != "ray":
            return
        try:
            import ray  # noqa: PLC0415

            if ray.is_initialized() and self.ray_started:
                ray.shutdown()
        except Exception:
            pass

    def _data_server(self, world: World):
        """slot -> the data its clients hold (placement.data_shard), for a host with no data set."""
        part = self.sc.task.partition
        split_here = splits_by_user(part)
        limit = int(self.placement.serve_data_mb * 2**20)

        def data_of(slot: str) -> tuple[dict, list[bytes]]:
            if split_here:  # the clients' rows exist only after a split of the whole data set, made on the host
                raise DataRefused(f"task.partition {part.kind} splits the whole data set on every host: give the host "
                                  "the data set (--data-root)")
            index = int(slot.removeprefix("host"))
            mine = [c.profile for c in world.clients if c.host == index]
            train_rows = np.unique(np.concatenate([p.indices for p in mine])) if mine else np.zeros(0, np.int64)
            tests = [p.test_indices for p in mine if p.test_indices is not None]
            test_rows = np.unique(np.concatenate(tests)) if tests else np.zeros(0, np.int64)
            return data_shard(world.task.train, world.task.test, train_rows, test_rows, limit)
        return data_of

    def _scenario_files(self) -> tuple[list[dict], list[bytes]]:
        """The files the scenario names (traces, capacity and availability files), for the welcome:
        a host reads them from there, not from its own disk."""
        listed, frames = [], []
        for at, paths in scenario_files(self.sc):
            listed.append({"at": list(at), "names": [Path(p).name for p in paths]})
            frames += [Path(p).read_bytes() for p in paths]
        size = sum(len(f) for f in frames)
        if size > self.placement.serve_data_mb * 2**20:
            raise PlacementError(f"the scenario's files are {size / 2**20:.1f} MiB, over the lobby's limit of "
                                 f"{self.placement.serve_data_mb:.0f} MiB (--serve-data-mb): raise it")
        return listed, frames

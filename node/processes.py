"""Entry points of the node processes (server, client host). They receive their part of the
world from the conductor and run a Runtime until told to stop."""
from __future__ import annotations

import logging
import sys
from typing import Callable

import torch
import zmq

from .device import EXIT_DEVICE, DeviceError, open_device
from .lifecycle import building, detach_from_terminal_signals, keep_freed_memory
from .async_server import AsyncServer
from .client import ClientActor, ClientConfig, ClientProfile, TaskSpec, Trainer
from .edge import EdgeServer
from .flower.client import FlowerClientConfig, make_client_actors  # no flwr until a Flower app's actors are made
from .ring import Evaluator, RingClientActor, RingConfig, WarmupAggregator
from .runtime import Runtime
from .server import ServerActor, ServerConfig

log = logging.getLogger(__name__)


def host_main(peer: str, endpoint: str, clients: list[ClientProfile], task: TaskSpec,
              cfg: ClientConfig | RingConfig | FlowerClientConfig,
              threads: int, parent_pid: int | None, restore: list[str] | None = None, host_index: int = 0,
              secure: Callable[[zmq.Socket], None] | None = None, silence_s: float | None = None) -> None:
    """A host of client actors: star clients sharing one model, or ring clients with their own.
    It opens its training device first (the CUDA context is made here, after the fork). A host
    that joined from another machine (parent_pid None) connects with `secure` and leaves when the
    network has been silent for silence_s."""
    if parent_pid is not None:
        detach_from_terminal_signals(parent_pid, peer)
    keep_freed_memory()
    torch.set_num_threads(threads)
    try:
        placement, device_info = open_device(task.plan, host_index)
    except DeviceError as exc:
        log.error("[%s] %s", peer, exc)
        Runtime.tell_fatal(peer, endpoint, str(exc), secure=secure)
        sys.exit(EXIT_DEVICE)
    task = task.on(placement.device)
    with building():  # tens of thousands of actors, kept for the whole run
        actors, group = _client_actors(clients, task, cfg, device_info)
        runtime = Runtime(peer, endpoint, actors, parent_pid, restore, announce={"type": "device", **device_info},
                          secure=secure, silence_s=silence_s, **group)
    runtime.run()


def _client_actors(clients: list[ClientProfile], task: TaskSpec, cfg: ClientConfig | RingConfig | FlowerClientConfig,
                   device_info: dict) -> tuple[list, dict]:
    """A host's actors, and how its cohorts train together (the Runtime's run_group and group_size)."""
    if isinstance(cfg, RingConfig):
        evaluator = Evaluator(task)
        return [RingClientActor(profile, task, cfg, evaluator) for profile in clients], {}
    if isinstance(cfg, FlowerClientConfig):
        return make_client_actors(clients, cfg), {}
    trainer = Trainer(task, cfg.cohort)
    actors = [ClientActor(profile, trainer, cfg) for profile in clients]
    cohorts = trainer.cohorts
    device_info["cohort"] = cohorts.max_size
    if cohorts.max_size > 1:
        return actors, {"run_group": cohorts.run_group, "group_size": cohorts.max_size}
    return actors, {}


def server_main(endpoint: str, cfg: ServerConfig, client_names: list[str], task: TaskSpec, threads: int,
                parent_pid: int, restore: list[str] | None = None, edges: list | None = None) -> None:
    """The server process: the server actor, and in a hierarchy the cloud (whose clients are the
    edges) with the edge aggregators, each an actor with its own link."""
    detach_from_terminal_signals(parent_pid, "server")
    keep_freed_memory()
    torch.set_num_threads(threads)
    server = (AsyncServer if cfg.strategy.asynchronous else ServerActor)(cfg, client_names, task)
    aggregators = [EdgeServer(e.name, e.server, e.clients, task, e.edge_rounds, e.cloud_codec) for e in edges or []]
    Runtime("server", endpoint, [server, *aggregators], parent_pid, restore).run()


def flower_server_main(endpoint: str, cfg, client_names: list[str], threads: int, parent_pid: int) -> None:
    """The server process of a Flower app: its ServerApp runs in a thread of the server actor."""
    from .flower.server import FlowerServerActor  # noqa: PLC0415

    detach_from_terminal_signals(parent_pid, "server")
    keep_freed_memory()
    torch.set_num_threads(threads)
    Runtime("server", endpoint, [FlowerServerActor(cfg, client_names)], parent_pid).run()


def warmup_main(endpoint: str, cfg: RingConfig, task: TaskSpec, aggregate_s: float, threads: int, parent_pid: int,
                restore: list[str] | None = None) -> None:
    """The server process of a ring whose warm-up FedAvg has an aggregator of its own (FibFL++)."""
    detach_from_terminal_signals(parent_pid, "server")
    keep_freed_memory()
    torch.set_num_threads(threads)
    Runtime("server", endpoint, [WarmupAggregator(cfg, task, aggregate_s)], parent_pid, restore).run()

"""Entry points of the node processes (server, client host). They receive their part of the
world from the conductor and run a Runtime until told to stop."""
from __future__ import annotations

import ctypes
import os
import signal

import torch

from .client import ClientActor, ClientConfig, ClientProfile, TaskSpec, Trainer
from .runtime import Runtime
from .server import ServerActor, ServerConfig

PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15


def detach_from_terminal_signals(parent_pid: int, name: str) -> None:
    """Die with the parent, name the process (for ps and top), and let the conductor alone decide
    about Ctrl-C."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        libc.prctl(PR_SET_NAME, f"flemu-{name}"[:15].encode())
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent_pid:
        os._exit(1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))


def host_main(peer: str, endpoint: str, clients: list[ClientProfile], task: TaskSpec, cfg: ClientConfig,
              threads: int, parent_pid: int) -> None:
    detach_from_terminal_signals(parent_pid, peer)
    torch.set_num_threads(threads)
    trainer = Trainer(task)
    actors = [ClientActor(profile, trainer, cfg) for profile in clients]
    Runtime(peer, endpoint, actors, parent_pid).run()


def server_main(endpoint: str, cfg: ServerConfig, client_names: list[str], task: TaskSpec, threads: int,
                parent_pid: int) -> None:
    detach_from_terminal_signals(parent_pid, "server")
    torch.set_num_threads(threads)
    Runtime("server", endpoint, [ServerActor(cfg, client_names, task)], parent_pid).run()

"""The emulator's Flower Grid. A ServerApp's `main(grid, context)` runs unmodified in a thread
of the server actor, and only while the actor waits for it: pushing messages costs no emulated
time, and every call that waits for replies (`pull_messages`, `send_and_receive`) hands control
back to the actor, which lets the emulated clock run until the replies are in, or until the
timeout (read as emulated seconds) passes. A reply that never comes is simply absent."""
from __future__ import annotations

import itertools
import queue
import random
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import numpy as np
from flwr.app import Message
from flwr.serverapp import Grid

from .identity import SUPERLINK_NODE_ID, empty_run, set_task_identity


@dataclass
class Wait:
    """What the app waits for: replies to `ids`, all of them (send_and_receive) or at least one
    new one (pull_messages), at most `timeout_s` emulated seconds (None: no limit)."""
    ids: list[str]
    every: bool
    timeout_s: float | None
    pushed: list[Message] = field(default_factory=list)  # messages pushed since the last wait, to send now
    sleep: bool = False  # the app slept: wait out timeout_s whatever arrives


@dataclass
class Finished:
    pushed: list[Message] = field(default_factory=list)
    error: str | None = None  # the app's traceback, when main raised


class EmulatedGrid(Grid):
    def __init__(self, node_ids: Callable[[], list[int]], hand_over: Callable[[Wait], dict[str, Message]]):
        self._node_ids = node_ids
        self._hand_over = hand_over
        self._pushed: list[Message] = []
        self._replies: dict[str, Message] = {}  # arrived and not yet pulled
        self._ids = itertools.count()
        self._run: Any = empty_run()

    # -- Grid --------------------------------------------------------------------------------
    def set_run(self, run: Any) -> None:
        self._run = run

    @property
    def run(self) -> Any:
        return self._run

    def create_message(self, content, message_type: str, dst_node_id: int, group_id: str, ttl: float | None = None) -> Message:
        return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

    def get_node_ids(self) -> Iterable[int]:
        return list(self._node_ids())

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        ids = []
        nodes = set(self._node_ids())  # the pool cannot change while the app runs: once per push
        for msg in messages:
            if msg.metadata.dst_node_id not in nodes:
                continue  # not a node of this run (or gone): Flower returns no id for it either
            msg.metadata.__dict__["_message_id"] = f"m{next(self._ids)}"  # deterministic, unlike Flower's uuid4
            self._pushed.append(msg)
            ids.append(msg.metadata.message_id)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        ids = list(message_ids)
        if not any(i in self._replies for i in ids):
            self._wait(Wait(ids, every=False, timeout_s=None))
        return [self._replies.pop(i) for i in ids if i in self._replies]

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        ids = list(self.push_messages(messages))
        if ids:
            self._wait(Wait(ids, every=True, timeout_s=timeout))
        return [self._replies.pop(i) for i in ids if i in self._replies]

    # -- the hand-over -----------------------------------------------------------------------
    def _wait(self, wait: Wait) -> None:
        wait.pushed, self._pushed = self._pushed, []
        self._replies.update(self._hand_over(wait))

    def sleep(self, seconds: float) -> None:
        """The app's time.sleep, in emulated seconds (Flower's strategies poll for nodes with it)."""
        self._wait(Wait([], every=False, timeout_s=max(0.0, float(seconds)), sleep=True))

    def take_pushed(self) -> list[Message]:
        pushed, self._pushed = self._pushed, []
        return pushed


def emulate_sleep(thread: threading.Thread, sleep: Callable[[float], None]) -> None:
    """time.sleep in `thread` becomes `sleep` (emulated seconds); elsewhere it stays as it was.
    Modules that took `from time import sleep` (flwr's among them) are given the same function.
    Only the server process, which runs the ServerApp, does this."""
    original = getattr(time.sleep, "__wrapped__", time.sleep)

    def routed(seconds: float) -> None:
        if threading.current_thread() is thread:
            sleep(seconds)
        else:
            original(seconds)

    routed.__wrapped__ = original  # type: ignore[attr-defined]
    time.sleep = routed
    for module in list(sys.modules.values()):
        if getattr(module, "sleep", None) is original:
            try:
                module.sleep = routed
            except (AttributeError, TypeError):
                pass


class AppThread:
    """main(grid, context) in a thread that runs only between advance() and its next wait."""

    def __init__(self, server_app: Any, context: Any, node_ids: Callable[[], list[int]], seed: int):
        self._to_app: queue.SimpleQueue = queue.SimpleQueue()
        self._from_app: queue.SimpleQueue = queue.SimpleQueue()
        self.grid = EmulatedGrid(node_ids, self._hand_over)
        self._thread = threading.Thread(target=self._main, args=(server_app, context, seed), name="flower-serverapp",
                                        daemon=True)
        self._started = False
        emulate_sleep(self._thread, self.grid.sleep)

    def advance(self, replies: dict[str, Message] | None = None) -> Wait | Finished:
        """Let the app run (with these replies, when it waits for some) until it waits again or ends."""
        if not self._started:
            self._started = True
            self._thread.start()
        else:
            self._to_app.put(replies or {})
        return self._from_app.get()

    def _hand_over(self, wait: Wait) -> dict[str, Message]:
        self._from_app.put(wait)
        return self._to_app.get()

    def _main(self, server_app: Any, context: Any, seed: int) -> None:
        import torch  # noqa: PLC0415

        # Flower's strategies sample nodes with the random module and apps initialise models with
        # torch: seeded, a run is the same every time
        random.seed(seed)
        np.random.seed(seed % 2**32)
        torch.manual_seed(seed)
        set_task_identity(node_id=SUPERLINK_NODE_ID)
        try:
            server_app(self.grid, context)
        except BaseException:  # noqa: BLE001  (the run must hear of anything, and the actor must not wait forever)
            self._from_app.put(Finished(self.grid.take_pushed(), traceback.format_exc(limit=6)))
            return
        self._from_app.put(Finished(self.grid.take_pushed()))

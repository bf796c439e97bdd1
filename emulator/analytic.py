"""The payload of a communication-only run, without processes: round by round, the bytes a
synchronous run with `algorithm.train: false` sends down and up, from the parts the run itself
uses (the partition, the server's selector and its per-round generator, n_max over the round's
selected clients, each client's importance and bit-length, and the real encoder's sizes).

It answers in seconds what a 1000-round run answers in minutes, for populations a laptop cannot
run (N = 1000 at T = 1000), and it is what the five published Dynamic totals of the core paper
are checked with (tests/test_paper_totals.py; docs/guide/paper.md). It holds where every selected
client completes: no deadline, drop-out, check-in or failure. Scenarios that leave that ground
are refused with the key that does. A test checks it against real runs, round by round."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import torch

from node.channel import Channel
from node.client import TaskSpec
from node.data import Dataset
from node.models import state_to_numpy
from node.schedule import importance
from node.selection import SelectionContext
from .scenario import Scenario, ScenarioError
from .world import build_world, load_task

GIB = 2**30
# the training and test sets' sizes per class, where only the labels matter (the Dynamic split and
# each client's label entropy depend on how many samples of each class there are, not on which)
LABEL_COUNTS = {"cifar10": (10, 5000, 1000), "mnist": None, "fashion_mnist": None}


@dataclass(frozen=True)
class RoundPayload:
    round: int
    selected: tuple[str, ...]
    bits_down: int | None
    bits_up: tuple[int | None, ...]  # per selected client, in selection order
    down_bytes: int  # the task to every selected client
    up_bytes: int  # every selected client's update


def refusal(sc: Scenario) -> str | None:
    """Why this scenario is outside what the analytic path reproduces, naming the key; None: inside."""
    checks = (
        (sc.topology != "star", f"topology: {sc.topology} (the analytic path is the star's synchronous rounds)"),
        (sc.algorithm.train, "algorithm.train: true (the analytic path is communication only: set it to false)"),
        (sc.algorithm.name != "fedavg", f"algorithm.name: {sc.algorithm.name} (only FedAvg's messages are modelled)"),
        (sc.selection.checkin, "selection.checkin: true (who is eligible depends on the devices' timing)"),
        (sc.round.timeout_s is not None, "round.timeout_s is set (a deadline may cut clients off)"),
        (bool(sc.faults), "faults are set (a client may fail)"),
    )
    return next((why for bad, why in checks if bad), None)


def labels_only_task(sc: Scenario) -> TaskSpec:
    """The scenario's task where its data set is absent but its class sizes are known (CIFAR-10's
    5000 training and 1000 test images per class): labels in class order and inputs of the right
    shape that take no memory. A split by labels, and every client's label counts, come out as
    with the real files, since FedML's split draws the same numbers whatever order a class's
    samples come in."""
    classes, train_per, test_per = LABEL_COUNTS[sc.task.dataset]
    shape = {"cifar10": (3, 32, 32)}[sc.task.dataset]

    def labels_only(per_class: int) -> Dataset:
        y = torch.arange(classes).repeat_interleave(per_class)
        return Dataset(torch.zeros((), dtype=torch.uint8).expand(y.numel(), *shape), y, classes)

    return TaskSpec(sc.task.model, labels_only(train_per), labels_only(test_per), sc.seed,
                    model_options=dict(sc.task.model_options))


def payload_by_round(sc: Scenario, task: TaskSpec | None = None) -> Iterator[RoundPayload]:
    """Each round's payload bytes, as a comm-only run of `sc` sends them (rounds 0 .. sc.rounds-1)."""
    why = refusal(sc)
    if why is not None:
        raise ScenarioError(f"the analytic payload cannot model this scenario: {why}")
    world = build_world(sc, task or load_task(sc))
    server, client = world.server, world.client
    names = [c.profile.name for c in world.clients]
    labels = world.task.train.y.numpy()
    classes = world.task.train.classes
    mine = {c.profile.name: labels[c.profile.indices] for c in world.clients}
    state = state_to_numpy(world.task.build())
    down = Channel(server.down_codec, layers=server.down_layers, schedule=server.schedule, side="server")
    up = Channel(client.up_codec, layers=client.up_layers, schedule=client.schedule, side="client")
    sizes: dict[tuple[str, int | None], int] = {}

    def size(channel: Channel, bits: int | None) -> int:
        """The real encoder's payload at this bit-length (it depends on nothing else for these codecs)."""
        key = (channel.side, bits)
        if key not in sizes:
            sizes[key] = channel.encode(state, np.random.default_rng(0), bits=bits).encoded.payload_bytes
        return sizes[key]

    pool = {name: {} for name in names}
    model_bytes = 4 * sum(v.size for v in state.values())
    asked = min(len(pool), int(math.ceil(server.clients_per_round * server.over_selection)))
    for index in range(sc.rounds):
        rng = np.random.default_rng([server.seed, index])  # the server's generator of the round, as in ServerActor._begin
        selected = tuple(server.selector.select(pool, asked, SelectionContext(index, rng, server.epochs, model_bytes)))
        n_max = max((server.samples.get(c, 0) for c in selected), default=0)
        bits_down = down.bits(index)
        # Eq. 1.7's nu_i as the client computes it (node/client.py), then its upload channel's bits
        nus = [importance(mine[c], classes, server.samples[c], n_max, client.lambda_h)
               if client.schedule.kind == "dynamic" else 1.0 for c in selected]
        bits_up = tuple(up.bits(index, nu) for nu in nus)
        yield RoundPayload(index, selected, bits_down, bits_up, len(selected) * size(down, bits_down),
                           sum(size(up, b) for b in bits_up))


def total_gib(sc: Scenario, task: TaskSpec | None = None) -> float:
    """Down plus up payload of the whole run, in GiB (2^30 bytes), as the paper's Table 6 counts."""
    return sum(r.down_bytes + r.up_bytes for r in payload_by_round(sc, task)) / GIB


def totals_gib(sc: Scenario, task: TaskSpec | None = None) -> tuple[float, float]:
    """(the run's payload GiB, the same counted as the core paper's code counts it). Here integer
    buffers (BatchNorm's num_batches_tracked) travel losslessly as raw int64, 8 bytes each; the
    authors' code quantized them with the weights (docs/algorithms.md 1.8), ceil(b/8) bytes
    each. VGG7 has four, the MNIST CNN none: only CIFAR-10 at N = 1000 shows it (0.006 GiB)."""
    task = task or load_task(sc)
    counters = sum(1 for v in state_to_numpy(task.build()).values() if v.dtype.kind in "iub")
    here = quantized_counters = 0
    for r in payload_by_round(sc, task):
        for bits in [r.bits_down] * len(r.selected) + list(r.bits_up):
            quantized_counters -= counters * (8 - math.ceil((bits or 32) / 8))
        here += r.down_bytes + r.up_bytes
    return here / GIB, (here + quantized_counters) / GIB


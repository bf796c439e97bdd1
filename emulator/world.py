"""Building the world from a scenario: who the clients are, what devices and links they have,
which samples they hold, and how they are spread over host processes. Pure and seeded."""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from node import data as datasets
from node.client import ClientConfig, ClientProfile, Privacy, TaskSpec
from node.privacy import noise_factor
from node.schedule import BitSchedule
from node.server import ServerConfig
from protocol.codecs import make_codec
from .links import INF, Framing
from .network import Fault, Link
from .scenario import Scenario, ScenarioError


@dataclass
class ClientInfo:
    profile: ClientProfile
    host: int
    device: str
    link_name: str
    link: Link


@dataclass
class World:
    task: TaskSpec
    clients: list[ClientInfo]
    server_link: Link
    server: ServerConfig
    client: ClientConfig
    hosts: int
    threads_per_host: int
    framing: Framing
    faults: list[Fault]


def mix_counts(shares: list[float], total: int) -> list[int]:
    """Largest-remainder apportionment: integer counts proportional to shares summing to total."""
    raw = np.asarray(shares, dtype=float) * total
    counts = np.floor(raw).astype(int)
    for i in np.argsort(-(raw - counts), kind="stable")[: total - counts.sum()]:
        counts[i] += 1
    return counts.tolist()


def assign_mix(shares: list[float], total: int, rng: np.random.Generator) -> np.ndarray:
    """Which mix entry each of `total` clients gets: exact counts, seeded shuffle."""
    labels = np.repeat(np.arange(len(shares)), mix_counts(shares, total))
    return rng.permutation(labels)


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def mbps(value: float | None) -> float:
    return INF if value is None else value * 1e6


def load_task(sc: Scenario) -> TaskSpec:
    t = sc.task
    try:
        train, test = datasets.load(
            t.dataset, t.data_root, t.download,
            samples=t.synthetic.samples, test_samples=t.synthetic.test_samples,
            shape=tuple(t.synthetic.shape), classes=t.synthetic.classes, seed=sc.seed,
        )
    except datasets.DataError as exc:
        raise ScenarioError(f"task.dataset: {exc}") from None
    return TaskSpec(t.model, train, test, sc.seed)


def build_world(sc: Scenario, task: TaskSpec | None = None) -> World:
    task = task or load_task(sc)
    rng = np.random.default_rng(sc.seed)
    n = sc.population.clients
    labels = task.train.y.numpy()
    part = sc.task.partition
    if part.kind == "iid":
        shards = datasets.partition_iid(labels.size, n, rng)
    elif part.kind == "by_user":
        try:
            shards = datasets.partition_by_user(labels, n, part.users, sc.seed, part.size_sigma)
        except datasets.DataError as exc:
            raise ScenarioError(f"task.partition: {exc}") from None
    else:
        try:
            shards = datasets.partition_dirichlet(labels, n, part.alpha, rng, part.min_size)
        except datasets.DataError as exc:
            raise ScenarioError(f"task.partition: {exc}") from None
    if min(s.size for s in shards) == 0:
        raise ScenarioError(f"task.partition: {labels.size} samples cannot give each of {n} clients at least one")
    devices = assign_mix([d.share for d in sc.population.devices], n, rng)
    links = assign_mix([lk.share for lk in sc.population.links], n, rng)
    hosts = min(sc.population.hosts or usable_cores(), n)
    width = max(4, len(str(n - 1)))
    clients = []
    for i in range(n):
        dev = sc.population.devices[devices[i]]
        lk = sc.population.links[links[i]]
        profile = ClientProfile(f"c{i:0{width}d}", i, shards[i], dev.ms_per_sample)
        link = Link(lk.up_mbps * 1e6, lk.down_mbps * 1e6, lk.latency_ms / 1000.0)
        clients.append(ClientInfo(profile, i * hosts // n, dev.name, lk.name, link))
    names = {c.profile.name for c in clients} | {"server"}
    faults = []
    for i, f in enumerate(sc.faults):
        if f.actor not in names:
            raise ScenarioError(f"faults[{i}].actor: no actor named {f.actor!r} (clients are c{0:0{width}d}..c{n - 1:0{width}d}, or 'server')")
        end = INF if f.duration_s is None else f.at_s + f.duration_s
        faults.append(Fault(f.kind, f.actor, f.at_s, end))
    alg = sc.algorithm
    per_round = sc.selection.per_round(n)
    q = alg.quantization
    schedule = BitSchedule(q.schedule, sc.rounds, q.b_min, q.b_max)
    server = ServerConfig(
        rounds=sc.rounds, clients_per_round=per_round, epochs=alg.local_epochs,
        batch_size=alg.batch_size, lr=alg.lr, down_codec=make_codec(alg.codec.down.model_dump()), seed=sc.seed,
        eval_every=sc.eval.every, eval_max_samples=sc.eval.max_samples, round_timeout_s=sc.round.timeout_s,
        aggregate_s=sc.server.aggregate_ms / 1000.0, schedule=schedule,
        samples={c.profile.name: int(c.profile.indices.size) for c in clients},
    )
    dp = alg.privacy
    privacy = Privacy(dp.mechanism, dp.epsilon or float("inf"), dp.delta, dp.clip,
                      noise_factor(dp.noise_factor, sc.rounds, alg.local_epochs, per_round, n))
    client = ClientConfig(make_codec(alg.codec.up.model_dump()), sc.seed, schedule, q.lambda_h, privacy,
                          alg.train, alg.shuffle)
    sl = sc.server.link
    return World(
        task=task, clients=clients,
        server_link=Link(mbps(sl.up_mbps), mbps(sl.down_mbps), sl.latency_ms / 1000.0),
        server=server, client=client, hosts=hosts, threads_per_host=max(1, usable_cores() // hosts),
        framing=Framing(sc.network.mss, sc.network.segment_overhead, sc.network.per_transfer_bytes),
        faults=faults,
    )

"""Building the world from a scenario: who the clients are, what devices and links they have,
which samples they hold, and how they are spread over host processes. Pure and seeded."""
from __future__ import annotations

import dataclasses
import glob
import os
from pathlib import Path
from dataclasses import dataclass, field

import numpy as np

from node import data as datasets
from node import firma
from node.client import ClientConfig, ClientProfile, TaskSpec
from node.codec_cost import CodecTime, calibrate, host_ms_per_sample
from node.device import DevicePlan
from node.seeding import drawing
from node.stages import Privacy
from node.models import PRIVATE_PREFIX, training_flops
from node.selection import Uniform
from node.plugins import is_import_path
from node.ring import RingConfig
from node.secure.client import SecureClient
from node.secure.config import SecureConfig
from node.strategies import Strategy, strategy_class
from node.strategies.fedavg import FedAvg
from node.privacy import add_noise, noise_factor
from node.schedule import BitSchedule
from node.server import ServerConfig
from . import devices as dev_model
from .flows.links import INF, Framing
from .flows.traces import SyntheticFades, Trace, TraceError, TraceRef, load_trace
from .netconfig import Fault, Link, client_name_width
from .scenario import FLOWER, Scenario, ScenarioError
from .topology import TOPOLOGIES
from .flows.transport import TcpParams


@dataclass
class ClientInfo:
    profile: ClientProfile
    host: int
    device: str
    link_name: str
    link: Link
    spec: dev_model.DeviceSpec | None = None


@dataclass
class EdgeInfo:
    """topology hierarchical: an edge aggregator, its clients, its access link, its rounds' configuration."""
    name: str
    clients: list[str]
    link: Link
    server: ServerConfig
    edge_rounds: int
    cloud_codec: object


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
    groups: dict[str, float]
    group_of: dict[str, list[str]]
    rto_s: float
    ring: RingConfig | None = None
    tcp: TcpParams | None = None  # None: the fluid transport
    flow_solver: str = "scratch"  # network.flow_solver
    group_queue_s: dict[str, float] = field(default_factory=dict)  # topology ring: the gossip configuration (no server process)
    edges: list[EdgeInfo] = field(default_factory=list)  # topology hierarchical: the edge aggregators (server is the cloud)
    flower: tuple | None = None  # algorithm flower: (FlowerServerConfig, FlowerClientConfig)
    traces: dict[tuple[str, str], TraceRef] = field(default_factory=dict)  # ("up"|"down", client) -> its capacity trace


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


def load_task(sc: Scenario, fetch: bool = True) -> TaskSpec:
    """The scenario's data set and model; with fetch=False a missing public data set is an error
    whatever task.download says (validate downloads nothing)."""
    t = sc.task
    try:
        train, test = datasets.load(
            t.dataset, t.data_root, t.download if fetch else False, t.dataset_options,
            samples=t.synthetic.samples, test_samples=t.synthetic.test_samples,
            shape=tuple(t.synthetic.shape), classes=t.synthetic.classes, seed=sc.seed,
        )
    except datasets.DataError as exc:
        raise ScenarioError(f"task.dataset: {exc}") from None
    task = TaskSpec(t.model, train, test, sc.seed, model_options=dict(t.model_options))
    if is_import_path(t.model):
        _check_user_model(task, t.dataset)
    return task


def _check_user_model(task: TaskSpec, dataset: str) -> None:
    """A user's model takes two of the data set's inputs and gives a score per class: a mismatch is
    the scenario's error, said before any process starts."""
    import torch  # noqa: PLC0415

    try:
        with torch.no_grad():
            out = task.build().eval()(task.train.batch(torch.arange(min(2, len(task.train.y))))[0])
        shape = tuple(getattr(out, "shape", ()))
        if len(shape) != 2 or shape[1] != task.train.classes:
            raise ValueError(f"it gives outputs of shape {shape}, not (batch, {task.train.classes})")
    except Exception as exc:  # the user's code: whatever it raises is reported in one line
        raise ScenarioError(f"task.model: {task.model} does not fit the inputs of {dataset} "
                            f"({task.train.input_shape}, {task.train.classes} classes): {exc}") from None


def build_world(sc: Scenario, task: TaskSpec | None = None) -> World:
    task = task or load_task(sc)
    rng = np.random.default_rng(sc.seed)  # drawn from in this order: the partition, the device mix, the link mix
    task, shards, test_shards = _shards(sc, task, rng)
    hosts = min(sc.population.hosts or usable_cores(), sc.population.clients)
    clients, traced = _clients(sc, task, rng, shards, test_shards, hosts)
    faults = _faults(sc, clients)
    groups, group_queue_s, group_of = _shared_links(sc, clients)
    server, client = _actor_configs(sc, task, clients, test_shards)
    flower = _flower(sc, server) if sc.algorithm.name == FLOWER else None
    parts = TOPOLOGIES[sc.topology].world_parts(sc, clients, task, server, group_of)  # the ring's order, the edges
    server = parts.pop("server", server)
    sl = sc.server.link
    task = dataclasses.replace(task, plan=DevicePlan(sc.task.device, hosts, sc.task.gpu_memory_fraction))
    return World(
        task=task, clients=clients,
        server_link=Link(mbps(sl.up_mbps), mbps(sl.down_mbps), sl.latency_ms / 1000.0, queue_s=_queue_s(sc, sl.queue_ms),
                         congestion_control=sl.congestion_control),
        server=server, client=client, hosts=hosts, threads_per_host=max(1, usable_cores() // hosts),
        framing=Framing(sc.network.mss, sc.network.segment_overhead, sc.network.per_transfer_bytes),
        faults=faults, groups=groups, group_of=group_of, rto_s=sc.network.rto_ms / 1000.0,
        tcp=_tcp_params(sc), group_queue_s=group_queue_s, flow_solver=sc.network.flow_solver, flower=flower,
        traces=traced, **parts,
    )


def _shards(sc: Scenario, task: TaskSpec, rng: np.random.Generator) -> tuple[TaskSpec, list, list]:
    """Each client's training samples and, where evaluation is per client, its own test split."""
    n = sc.population.clients
    part = sc.task.partition
    test_shards: list = [None] * n
    if splits_by_user(part):
        # The users' own test parts are the test set; each client's are its own test split.
        try:
            split = datasets.leaf_split(task.train, task.test, n) if part.kind == "natural" else \
                datasets.fedprox_split(task.train, task.test, n, part.users, sc.seed, part.train_share,
                                       2.0 if part.size_sigma is None else part.size_sigma)
        except datasets.DataError as exc:
            raise ScenarioError(f"task.partition: {exc}") from None
        task = dataclasses.replace(task, train=split.train, test=split.test)
        shards = split.train_shards
        if _evaluates_on_clients(sc):
            test_shards = split.test_shards
    else:
        shards = _partition(sc, task.train.y.numpy(), rng, "task.partition")
    # Each client's own test split, by the same rule on the test labels (an independent draw for the
    # random ones, as FIRMA's data.py does), where evaluation is per client.
    if _evaluates_on_clients(sc) and test_shards[0] is None:
        test_rng = np.random.default_rng([sc.seed, 0x7E57])
        test_shards = _partition(sc, task.test.y.numpy(), test_rng, "task.partition (test split)", test=True)
    if min(s.size for s in shards) == 0:
        raise ScenarioError(f"task.partition: {task.train.y.numel()} samples cannot give each of {n} clients at least one")
    return task, shards, test_shards


def splits_by_user(partition) -> bool:
    """Whether the clients' samples come from a split of the whole data set by user (its own test
    parts too), rather than from indices into the data set as loaded."""
    return partition.kind == "natural" or (partition.kind == "by_user" and partition.generator == "fedprox")


def _evaluates_on_clients(sc: Scenario) -> bool:
    """Whether each client scores the model on its own test split (the topology's way, or eval.split)."""
    return TOPOLOGIES[sc.topology].evaluates_on_clients or sc.eval.split == "clients"


def _clients(sc: Scenario, task: TaskSpec, rng: np.random.Generator, shards: list, test_shards: list,
             hosts: int) -> list[ClientInfo]:
    """Every client: its profile (samples, speed), device, access link and host."""
    n = sc.population.clients
    devices = assign_mix([d.share for d in sc.population.devices], n, rng)
    links = assign_mix([lk.share for lk in sc.population.links], n, rng)
    width = client_name_width(n)
    capacity = _trace_records(sc.population.capacity_trace, "population.capacity_trace")
    behaviour = _trace_records(sc.population.availability.trace, "population.availability.trace") \
        if sc.population.availability.kind == "trace" else None
    ms_of = device_ms_per_sample(sc, task)
    traces = LinkTraces(sc)
    traced: dict[tuple[str, str], TraceRef] = {}
    shared_links: dict[tuple, Link] = {}
    clients = []
    for i in range(n):
        dev = sc.population.devices[devices[i]]
        lk = sc.population.links[links[i]]
        ms = ms_of[devices[i]]
        up, down = (lk.up_mbps or 0.0) * 1e6, (lk.down_mbps or 0.0) * 1e6
        if capacity is not None:  # FedScale capacity: client i takes record i mod len, ids in sorted order
            where = f"population.capacity_trace[{capacity[i % len(capacity)][0]}]"
            try:
                ms, kbps = dev_model.capacity_from_trace(capacity[i % len(capacity)][1], where)
            except ValueError as exc:
                raise ScenarioError(str(exc)) from None
            up = down = kbps * 1e3
        profile = ClientProfile(f"c{i:0{width}d}", i, shards[i], ms, test_shards[i], sc.task.feature_noise * (i + 1) / n,
                                dev.ms_per_batch)
        if lk.traced:  # a traced direction's nominal rate is its trace's mean (the network follows the trace)
            for direction, spec in (("up", lk.up_trace), ("down", lk.down_trace)):
                if spec is not None:
                    ref, mean = traces.assign(spec, f"population.links[{links[i]}].{direction}_trace", i, direction, links[i])
                    traced[(direction, profile.name)] = ref
                    up, down = (mean, down) if direction == "up" else (up, mean)
        fields = (up, down, lk.latency_ms / 1000.0, lk.jitter_ms / 1000.0, lk.loss, _queue_s(sc, lk.queue_ms),
                  dev.congestion_control)
        # clients with the same link share one (frozen) Link: it travels to the network once
        link = shared_links.get(fields)
        if link is None:
            link = shared_links[fields] = Link(*fields)
        spec = _device_spec(sc, i, dev, lk.name, behaviour, drawing([sc.seed, i, 0xD1]))
        clients.append(ClientInfo(profile, i * hosts // n, dev.name, lk.name, link, spec))
    return clients, traced


class LinkTraces:
    """The trace files of the scenario's link mixes, each read once: a client of a traced mix draws
    its file from the mix's pool and its start offset, from a generator of its own (so the other
    draws of the world, and a scenario without traces, are as they were)."""

    def __init__(self, sc: Scenario):
        self.sc = sc
        root = sc.task.data_root or os.environ.get(datasets.ENV_DATA_ROOT)
        self.root = Path(root) if root else datasets.default_data_root()
        self.read: dict[TraceRef, Trace] = {}
        self.fades: dict[int, SyntheticFades] = {}  # one generator description per spec, shared by its clients

    def files(self, spec, key: str) -> list[str]:
        patterns = [spec.files] if isinstance(spec.files, str) else list(spec.files)
        found: list[str] = []
        for pattern in patterns:
            base = Path(pattern) if Path(pattern).is_absolute() else self.root / pattern
            hits = sorted(glob.glob(str(base))) if glob.has_magic(str(base)) else ([str(base)] if base.is_file() else [])
            if not hits:
                raise ScenarioError(f"{key}.files: no trace file matches {pattern!r} (relative paths are under the "
                                    f"scenario's folder or the data root {self.root})")
            found += hits
        return found

    def assign(self, spec, key: str, index: int, direction: str, mix: int = 0) -> tuple[TraceRef, float]:
        """Client `index`'s trace for one direction (its link mix's `mix`), and the trace's mean rate (bit/s)."""
        side = 0 if direction == "up" else 1
        rng = np.random.default_rng([self.sc.seed, index, 0x7ACE, side])
        if spec.synthetic is not None:  # a generated trace, made by the network when a flow first uses
            # the link (most of a large population's never carry one): the client's own, or one of the mix's pool
            fades = self.fades.get(id(spec.synthetic))
            if fades is None:
                fades = self.fades[id(spec.synthetic)] = SyntheticFades(**spec.synthetic.model_dump(exclude={"pool"}))
            pool = spec.synthetic.pool
            seed = (self.sc.seed, index, 0x5F, side) if pool is None else \
                (self.sc.seed, mix, 0x5F0, side, int(rng.integers(pool)))
            ref = TraceRef("", 0.0, spec.format, spec.bin_ms / 1000.0, spec.loop, fades, seed)
            offset = float(rng.uniform(0.0, fades.period(ref.bin_s))) if spec.offset == "random" else 0.0
            return dataclasses.replace(ref, offset_s=offset), fades.mean_bps
        pool = self.files(spec, key)
        path = pool[int(rng.integers(len(pool)))] if len(pool) > 1 else pool[0]
        ref = TraceRef(path, 0.0, spec.format, spec.bin_ms / 1000.0, spec.loop)
        if ref.source not in self.read:
            try:
                self.read[ref.source] = load_trace(ref)
            except TraceError as exc:
                raise ScenarioError(f"{key}: {exc}") from None
        trace = self.read[ref.source]
        offset = float(rng.uniform(0.0, trace.period)) if spec.offset == "random" else 0.0
        return dataclasses.replace(ref, offset_s=offset), trace.mean_bps


def scenario_files(sc: Scenario) -> list[tuple[tuple, list[str]]]:
    """The files the scenario names, as (where in the resolved scenario, the files there): the
    capacity and availability files and each link mix's trace pool (globs expanded, in the order
    clients draw from). A host on another machine gets them from the lobby (emulator/host.py)."""
    named: list[tuple[tuple, list[str]]] = []
    pop = sc.population
    if pop.capacity_trace:
        named.append((("population", "capacity_trace"), [pop.capacity_trace]))
    if pop.availability.trace:
        named.append((("population", "availability", "trace"), [pop.availability.trace]))
    traces = LinkTraces(sc)
    for i, mix in enumerate(pop.links):
        for direction, spec in (("up_trace", mix.up_trace), ("down_trace", mix.down_trace)):
            if spec is not None and spec.files is not None:
                named.append((("population", "links", i, direction, "files"),
                              traces.files(spec, f"population.links[{i}].{direction}")))
    return named


def _faults(sc: Scenario, clients: list[ClientInfo]) -> list[Fault]:
    n, width = len(clients), client_name_width(len(clients))
    names = {c.profile.name for c in clients} | {"server"}
    faults = []
    for i, f in enumerate(sc.faults):
        if f.actor not in names:
            raise ScenarioError(f"faults[{i}].actor: no actor named {f.actor!r} (clients are c{0:0{width}d}..c{n - 1:0{width}d}, or 'server')")
        end = INF if f.duration_s is None else f.at_s + f.duration_s
        faults.append(Fault(f.kind, f.actor, f.at_s, end))
    return faults


def _shared_links(sc: Scenario, clients: list[ClientInfo]) -> tuple[dict, dict, dict]:
    """The shared bottlenecks (name:up and name:down -> bit/s), their buffers, and who crosses which."""
    groups: dict[str, float] = {}
    group_queue_s: dict[str, float] = {}
    group_of: dict[str, list[str]] = {}
    for shared in sc.population.shared_links:
        groups[f"{shared.name}:up"] = mbps(shared.up_mbps)
        groups[f"{shared.name}:down"] = mbps(shared.down_mbps)
        group_queue_s[f"{shared.name}:up"] = group_queue_s[f"{shared.name}:down"] = _queue_s(sc, shared.queue_ms)
        for c in clients:
            if c.link_name in shared.links:
                group_of.setdefault(c.profile.name, []).append(shared.name)
    return groups, group_queue_s, group_of


def _actor_configs(sc: Scenario, task: TaskSpec, clients: list[ClientInfo], test_shards: list
                   ) -> tuple[ServerConfig, ClientConfig]:
    """What the server actor and every client actor are configured with."""
    alg, n = sc.algorithm, sc.population.clients
    per_round = sc.selection.per_round(n)
    tensor_names = list(task.build().state_dict())
    strategy = _strategy(sc)
    q = alg.quantization
    schedule = BitSchedule(q.schedule, q.horizon or sc.rounds, q.b_min, q.b_max)
    server = ServerConfig(
        rounds=sc.rounds, clients_per_round=per_round, epochs=alg.local_epochs,
        batch_size=alg.batch_size, lr=alg.lr, down_codec=alg.codec.down.build(), seed=sc.seed,
        eval_every=sc.eval.every if alg.train else 0, eval_max_samples=sc.eval.max_samples, round_timeout_s=sc.round.timeout_s,
        aggregate_s=sc.server.aggregate_ms / 1000.0, schedule=schedule,
        samples={c.profile.name: int(c.profile.indices.size) for c in clients},
        selector=sc.selection.build_selector(), over_selection=sc.selection.over_selection, round_policy=sc.round.policy,
        notify_closed=sc.round.notify_closed,
        checkin=sc.selection.checkin, checkin_wait_s=sc.selection.checkin_wait_s,
        min_clients=sc.selection.min_clients, wait_s=sc.selection.wait_s, checkpoint_every=sc.run.checkpoint_every,
        strategy=strategy,
        eval_shards=test_shards if sc.eval.split == "clients" else None,
        down_layers=alg.codec.down.build_layers(tensor_names),
    )
    dp = alg.privacy
    privacy = Privacy(dp.mechanism, dp.epsilon or float("inf"), dp.delta, dp.clip,
                      noise_factor(dp.noise_factor, dp.horizon or sc.rounds, alg.local_epochs, per_round, n),
                      dp.noise_multiplier or 0.0, dp.sampling, dp.accounting_delta, dp.resolved_compute_factor,
                      dp.calibration)
    client = ClientConfig(alg.codec.up.build(), sc.seed, schedule, q.lambda_h, privacy,
                          alg.train, alg.shuffle, sc.selection.checkin, error_feedback=alg.codec.up.error_feedback, max_samples=alg.max_samples_per_round,
                          up_layers=alg.codec.up.build_layers(tensor_names), strategy=strategy,
                          cohort=alg.cohort, codec_time=_codec_time(sc, task, server, schedule, privacy, tensor_names),
                          update_statistics=server.selector.update_statistics)
    server.secure = _secure(sc, task)
    if server.secure is not None:
        client.secure = SecureClient(server.secure, sc.seed)
    return server, client


def _secure(sc: Scenario, task: TaskSpec) -> SecureConfig | None:
    """algorithm.secure_aggregation, its cost table pinned or measured now, before any host forks."""
    spec = sc.algorithm.secure_aggregation
    host_ms = None
    if spec.protocol != "none" and spec.charge_compute and spec.costs is None:
        inputs, labels = task.train.batch(np.arange(min(64, len(task.train.y))))
        host_ms = host_ms_per_sample(task.build(), inputs, labels)
    return spec.build(host_ms)


def hierarchy_edges(sc: Scenario, clients: list[ClientInfo], server: ServerConfig, group_of: dict[str, list[str]]) -> list[EdgeInfo]:
    """The edge aggregators and their clients. With edges from shared links, the site's shared link
    carries the edge's traffic to the cloud instead of its clients' traffic to the edge (the
    aggregator sits at the site); each client's updates go to its edge."""
    h = sc.hierarchy
    if h.edges == "shared_links":
        names = [shared.name for shared in sc.population.shared_links]
        members: dict[str, list[str]] = {name: [] for name in names}
        for c in clients:
            groups = group_of.pop(c.profile.name, [])
            if not groups:
                raise ScenarioError(f"hierarchy.edges: client {c.profile.name} (link mix {c.link_name!r}) is behind no "
                                    f"population.shared_links entry, so it has no edge")
            members[groups[0]].append(c.profile.name)
        for name in names:
            group_of[f"edge-{name}"] = [name]
        members = {f"edge-{name}": m for name, m in members.items() if m}
    else:
        members = {f"edge{j}": [c.profile.name for c in clients if c.profile.index % h.edges == j] for j in range(h.edges)}
    aggregator = {c: edge for edge, names in members.items() for c in names}
    for c in clients:
        c.profile.aggregator = aggregator[c.profile.name]
    n = len(clients)
    el = h.link
    link = Link(mbps(el.up_mbps), mbps(el.down_mbps), el.latency_ms / 1000.0, queue_s=_queue_s(sc, el.queue_ms),
                congestion_control=el.congestion_control)
    out = []
    for j, (name, mine) in enumerate(members.items()):
        cfg = dataclasses.replace(server, rounds=sc.rounds * h.edge_rounds, eval_every=0, checkpoint_every=None,
                                  clients_per_round=max(1, round(server.clients_per_round * len(mine) / n)),
                                  samples={c: server.samples[c] for c in mine}, seed=sc.seed + 7919 * (j + 1),
                                  strategy=_strategy(sc))
        out.append(EdgeInfo(name, mine, link, cfg, h.edge_rounds, h.codec.build()))
    return out


def cloud_config(sc: Scenario, server: ServerConfig, edges: list[EdgeInfo]) -> ServerConfig:
    """The cloud server of a hierarchy: every edge every cloud round, FedAvg weighted by the edges' data."""
    return dataclasses.replace(
        server, clients_per_round=len(edges), selector=Uniform(), over_selection=1.0,
        round_policy="all", round_timeout_s=None, checkin=False, min_clients=1, down_codec=edges[0].cloud_codec,
        down_layers={}, samples={e.name: sum(e.server.samples.values()) for e in edges}, strategy=FedAvg(),
        secure=None)  # secure aggregation runs at the edges, between each edge and its clients


def _queue_s(sc: Scenario, queue_ms: float | None) -> float:
    return (sc.network.queue_ms if queue_ms is None else queue_ms) / 1000.0


def _tcp_params(sc: Scenario) -> TcpParams | None:
    """None for the fluid transport."""
    net = sc.network
    if net.transport != "tcp":
        return None
    t = net.tcp
    return TcpParams(initcwnd=t.initcwnd, beta=t.beta, cubic_c=t.cubic_c, rwnd_bytes=t.rwnd_bytes,
                     restart_after_idle=t.restart_after_idle, rto_min_s=net.rto_ms / 1000.0, growth_step=t.growth_step,
                     hystart=t.hystart, congestion_control=t.congestion_control)


def device_ms_per_sample(sc: Scenario, task: TaskSpec) -> list[float]:
    """Each device mix entry's training time per sample: as given, or the model's training FLOPs
    over the device's sustained GFLOP/s, so one device profile serves every model."""
    flops = None
    out = []
    for dev in sc.population.devices:
        if dev.ms_per_sample is not None:
            out.append(dev.ms_per_sample)
            continue
        if flops is None:
            flops = training_flops(task.build(), task.train.input_shape)
        out.append(flops / (dev.gflops * 1e9) * 1000.0)
    return out


def _partition(sc: Scenario, labels: np.ndarray, rng: np.random.Generator, key: str, test: bool = False) -> list[np.ndarray]:
    n = sc.population.clients
    part = sc.task.partition
    try:
        if part.kind == "iid" or (part.kind == "by_user" and test):  # users exist only in the training set
            return datasets.partition_iid(labels.size, n, rng)
        if part.kind == "by_user":
            return datasets.partition_by_user(labels, n, part.users, sc.seed,
                                              1.0 if part.size_sigma is None else part.size_sigma)
        if part.kind == "label_skew":
            return datasets.partition_label_skew(labels, n, part.classes_per_client, rng)
        if part.rule == "floor":
            return datasets.partition_dirichlet_floor(labels, n, part.alpha, rng)
        if part.rule == "fedml" and not test:
            return datasets.partition_dirichlet_fedml(labels, n, part.alpha, part.min_size)
        return datasets.partition_dirichlet(labels, n, part.alpha, rng, 1 if test else part.min_size)
    except datasets.DataError as exc:
        raise ScenarioError(f"{key}: {exc}") from None


def _strategy(sc: Scenario) -> Strategy:
    """The star algorithm, built by name from its own options (a ring has no server: FedAvg, unused)."""
    alg = sc.algorithm
    if not TOPOLOGIES[sc.topology].runs_strategy or alg.name == FLOWER:  # no strategy of ours runs
        return FedAvg()
    cls = strategy_class(alg.name)
    return cls(getattr(alg, cls.options_key).model_dump() if cls.options_key != "options" else alg.options, seed=sc.seed)


def _flower(sc: Scenario, server: ServerConfig) -> tuple:
    """The Flower app's server and client configuration; its components are loaded here once, so
    that a missing extra, module or object is an error before any process starts."""
    import importlib.util  # noqa: PLC0415

    if importlib.util.find_spec("flwr") is None:
        raise ScenarioError("algorithm.name flower: Flower is not installed (pip install -e '.[flower]')")
    from node.flower.app import FlowerAppError, load_component, read_app  # noqa: PLC0415
    from node.flower.client import FlowerClientConfig  # noqa: PLC0415
    from node.flower.server import FlowerServerConfig  # noqa: PLC0415

    spec, alg = sc.algorithm.flower, sc.algorithm
    try:
        ref = read_app(spec.app or spec.server_app or "", spec.server_app, spec.client_app, dict(spec.run_config))
        load_component(ref, "server")
        load_component(ref, "client")
    except FlowerAppError as exc:
        raise ScenarioError(f"algorithm.flower: {exc}") from None
    timeout = spec.timeout_s if spec.timeout_s is not None else sc.round.timeout_s
    return (FlowerServerConfig(ref, server.down_codec, sc.seed, server.aggregate_s, timeout, spec.samples_metric,
                               spec.metrics.model_dump(), spec.log_level, sc.selection.checkin, server.selector,
                               spec.wait_for_nodes_s),
            FlowerClientConfig(ref, alg.codec.up.build(), sc.seed, sc.population.clients, alg.local_epochs, alg.batch_size,
                               spec.samples_metric, spec.samples, spec.log_level, sc.selection.checkin))


def ring_config(sc: Scenario, clients: list[ClientInfo], task: TaskSpec) -> RingConfig:
    """The ring and its order. FibFL++'s 2-opt order is computed here, before training, from the
    clients' class proportions; a deployment would have to share those proportions once, which
    the emulator does not charge (N vectors of C floats)."""
    f = sc.algorithm.firma
    ordering = f.ordering if f.ordering != "auto" else ("two_opt" if f.variant == "fibfl++" else "identity")
    names = [c.profile.name for c in clients]
    if ordering == "two_opt":
        labels = task.train.y.numpy()
        q = firma.class_proportions([labels[c.profile.indices] for c in clients], task.train.classes)
        names = [names[i] for i in firma.two_opt(q)]
    alg = sc.algorithm
    prefix = PRIVATE_PREFIX[sc.task.model]
    model, shape = task.build(), task.train.input_shape
    head_share = training_flops(model, shape, trained=prefix) / training_flops(model, shape)
    return RingConfig(f.variant, sc.rounds, names, sc.seed, f.epochs_head, f.epochs_extractor, alg.lr, alg.batch_size,
                      f.gamma, f.gamma_start, f.gamma_end, f.tau, alg.codec.up.build(), sc.eval.every,
                      prefix, f.pass_timeout_s, head_share, f.init, f.warmup_aggregator, sc.run.checkpoint_every)


def _codec_time(sc: Scenario, task: TaskSpec, server: ServerConfig, schedule: BitSchedule, privacy: Privacy,
                tensor_names: list[str]) -> CodecTime | None:
    """What a client's codec work costs on this machine: the scenario's pinned table, or measured
    now, at every bit-length the schedule can give, before any host forks (node/codec_cost.py)."""
    alg = sc.algorithm
    if not alg.charge_codec_time:
        return None
    if alg.codec_time is not None:
        return CodecTime(**alg.codec_time.model_dump())
    up = alg.codec.up.build()

    def bit_lengths(codec) -> list[int | None]:
        own = getattr(codec, "bits", None)
        return list(range(schedule.b_min, schedule.b_max + 1)) if schedule.adaptive and own is not None else [own]

    noise = None
    if privacy.mechanism in ("laplace", "gaussian"):
        noise = lambda state, rng: add_noise(state, privacy.mechanism, 1.0, rng)  # noqa: E731
    inputs, labels = task.train.batch(np.arange(min(64, len(task.train.y))))
    return calibrate(task.build(), inputs, labels, server.down_codec, up, bit_lengths(server.down_codec), bit_lengths(up),
                     noise, down_layers=server.down_layers, up_layers=alg.codec.up.build_layers(tensor_names))


def _trace_records(path: str | None, key: str) -> list[tuple[str, dict]] | None:
    if not path:
        return None
    try:
        records = dev_model.load_trace_file(path)
    except (OSError, ValueError) as exc:
        raise ScenarioError(f"{key}: {exc}") from None
    return sorted(records.items(), key=lambda kv: (len(kv[0]), kv[0]))


def _device_spec(sc: Scenario, i: int, dev, link_name: str, behaviour, rng: np.random.Generator) -> dev_model.DeviceSpec:
    avail = sc.population.availability
    if avail.kind == "markov":
        availability = dev_model.MarkovAvailability(avail.mean_on_s, avail.mean_off_s, rng)
    elif avail.kind == "trace":
        cid, record = behaviour[i % len(behaviour)]
        try:
            availability = dev_model.behaviour_from_trace(record, f"population.availability.trace[{cid}]")
        except ValueError as exc:
            raise ScenarioError(str(exc)) from None
    else:
        availability = dev_model.AlwaysOn()
    battery = None
    if dev.battery_wh is not None:
        capacity_j = dev.battery_wh * 3600.0
        low, high = dev.battery_start
        battery = dev_model.Battery(capacity_j, capacity_j * float(rng.uniform(low, high)),
                                    charging=bool(rng.random() < dev.charging_share), charge_w=dev.charge_w, idle_w=dev.idle_w)
    if isinstance(availability, dev_model.MarkovAvailability):
        availability.park_stream()  # its later draws follow the battery's, from the lent generator's state
    return dev_model.DeviceSpec(i, dev.name, link_name, availability, battery, dev.train_w, dev.j_per_mb_up,
                                dev.j_per_mb_down, dev.load_mean, dev.load_period_s)

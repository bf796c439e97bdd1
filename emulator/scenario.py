"""Scenario files: YAML validated against a strict schema before anything starts.

Every error names the file, the key path and what was expected, e.g.
`s.yaml: population.links[1].share: must be <= 1, got 1.5`."""
from __future__ import annotations

import glob
import re
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, Optional, Union

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from protocol.codecs import CodecError, make_codec
from node.data import DATASETS
from node.device import check_spec
from node.models import MODELS, NO_PER_SAMPLE_GRADIENTS, user_model
from node.plugins import PluginError, is_import_path, resolve_callable
from node.selection import Oort, Selector, selector_class
from node.strategies import REGISTRY, StrategyError, strategy_class
from node.strategies.fedalign import FedAlign
from node.secure.config import SecureAggregationSpec

from .flows.congestion import CONGESTION_CONTROLS
from .rules import (FeedbackNeedsContraction, Fits, Needs, OneOf, OnlyWhen, Ordered, OwnOptions, SectionRefusal, SumBelow,
                    algorithm_fits, check_section, scenario_refusals, secure_fits, selector_fits)
from .topology import TOPOLOGIES


class ScenarioError(ValueError):
    """A scenario is invalid; str() is a complete, user-facing message."""


def _registered_congestion_control(name: str) -> str:
    CONGESTION_CONTROLS.get(name)  # a PluginError is a ValueError: one line naming the key
    return name


# a registered congestion control (emulator/flows/congestion.py) or package.module:Class
CongestionControlName = Annotated[str, AfterValidator(_registered_congestion_control)]


class Strict(BaseModel):
    """A section: unknown keys refused, and its declared rules over its own fields (emulator/rules.py)."""
    model_config = ConfigDict(extra="forbid")
    rules: ClassVar[tuple] = ()

    @model_validator(mode="after")
    def _declared_rules(self):
        return check_section(self)


class DeviceMix(Strict):
    name: str = "device"
    share: float = Field(1.0, ge=0, le=1)
    source: Optional[str] = Field(None, description="where the numbers come from (documentation only)")
    ms_per_sample: Optional[float] = Field(None, gt=0, description="modelled training time per sample per epoch, whatever the model")
    gflops: Optional[float] = Field(
        None, gt=0, description="sustained GFLOP/s: training time per sample is the model's training FLOPs over this")
    ms_per_batch: float = Field(0.0, ge=0, description="fixed time of one training step (optimizer, dispatch), whatever the batch size")
    train_w: float = Field(0.0, ge=0, description="power drawn while training")
    j_per_mb_up: float = Field(0.0, ge=0, description="radio energy per MB sent")
    j_per_mb_down: float = Field(0.0, ge=0, description="radio energy per MB received")
    battery_wh: Optional[float] = Field(None, gt=0, description="null: mains powered, never runs dry")
    congestion_control: Optional[CongestionControlName] = Field(
        None, description="what the device's uploads are sent with (tcp transport): cubic (Android's and iOS's default), "
                          "bbr, reno or package.module:Class; null: network.tcp.congestion_control")
    battery_start: list[float] = Field(default_factory=lambda: [1.0, 1.0], min_length=2, max_length=2,
                                       description="initial charge, uniform in [low, high] (fractions)")
    idle_w: float = Field(0.0, ge=0, description="drain when not training")
    charge_w: float = Field(0.0, ge=0, description="charging power while plugged in")
    charging_share: float = Field(0.0, ge=0, le=1, description="fraction of these devices plugged in for the run")
    load_mean: float = Field(0.0, ge=0, lt=1, description="mean background CPU load (Beta-distributed per period)")
    load_period_s: float = Field(60.0, gt=0, description="how long one background-load level lasts")

    rules = (OneOf("ms_per_sample", "gflops"),)

    @field_validator("battery_start")
    @classmethod
    def _start(cls, v):
        if not 0 <= v[0] <= v[1] <= 1:
            raise ValueError(f"battery_start must be [low, high] with 0 <= low <= high <= 1, got {v}")
        return v


class SyntheticSpec(Strict):
    """A generated cellular trace (emulator/flows/traces.py's SyntheticFades: defaults fitted to the
    public Mahimahi recordings)."""
    mean_mbps: float = Field(gt=0, description="the trace's mean rate")
    fade_share: float = Field(0.11, ge=0, lt=1, description="share of the time in fades")
    fade_s: float = Field(2.7, gt=0, description="mean length of a fade")
    fade_level: float = Field(0.15, ge=0, lt=1, description="a fade's rate, relative to the mean")
    outage_share: float = Field(0.01, ge=0, lt=1, description="share of the time with no capacity")
    outage_s: float = Field(2.0, gt=0, description="mean length of an outage")
    good_cv: float = Field(0.45, ge=0, description="coefficient of variation of the good periods' levels")
    good_step_s: float = Field(2.0, gt=0, description="how long a good level lasts before it is drawn again")
    duration_s: float = Field(600.0, gt=0, description="generated once per client, then looped")
    pool: Optional[int] = Field(
        None, ge=1, le=100000, description="null: a trace of its own per client; N: N traces for the link mix's direction, "
                                           "each client one of them (seeded) from its own offset, as with files: a large "
                                           "population's links then cost N traces, not one each")

    rules = (SumBelow(("fade_share", "outage_share"), 1.0, " (the good periods need some of the time)"),)


class TraceSpec(Strict):
    """A link direction's capacity from recorded traces, or a generated one (emulator/flows/traces.py)."""
    files: Union[str, list[str], None] = Field(
        None, description="trace files or globs: absolute, relative to the scenario file, or else to the data root "
                          "(task.data_root or $EMULATOR_DATA); each client of the mix draws one, seeded")
    synthetic: Optional[SyntheticSpec] = Field(
        None, description="instead of files: a seeded generated trace per client (fades and outages fitted to public "
                          "cellular recordings)")
    format: Literal["auto", "mahimahi", "series"] = Field(
        "auto", description="mahimahi: mm-link's delivery times in ms; series: 'time_s Mbit/s' lines; auto: by the first line")
    bin_ms: float = Field(100.0, gt=0, description="the rate is the trace's mean over bins this long")
    loop: bool = Field(True, description="start again at the end (as mm-link does); false: keep the last bin's rate")
    offset: Literal["random", "zero"] = Field(
        "random", description="where in its trace each client starts: random (seeded, so clients do not fade in lockstep) or zero")
    rules = (OneOf("files", "synthetic"),)


class LinkMix(Strict):
    name: str = "link"
    share: float = Field(1.0, ge=0, le=1)
    source: Optional[str] = Field(None, description="where the numbers come from (documentation only)")
    up_mbps: Optional[float] = Field(None, gt=0, description="the uplink's rate; or up_trace")
    down_mbps: Optional[float] = Field(None, gt=0, description="the downlink's rate; or down_trace")
    up_trace: Optional[TraceSpec] = Field(None, description="the uplink's capacity over time, from traces")
    down_trace: Optional[TraceSpec] = Field(None, description="the downlink's capacity over time, from traces")
    latency_ms: float = Field(0.0, ge=0, description="one-way latency of the access link")
    jitter_ms: float = Field(0.0, ge=0, description="mean of an exponential extra delay per message")
    loss: float = Field(0.0, ge=0, lt=1, description="random segment loss probability")
    queue_ms: Optional[float] = Field(
        None, ge=0, description="bottleneck buffer of this access link in ms of its rate (tcp transport); null: network.queue_ms")
    rules = (OneOf("up_mbps", "up_trace"), OneOf("down_mbps", "down_trace"))

    @property
    def traced(self) -> bool:
        return self.up_trace is not None or self.down_trace is not None


class Availability(Strict):
    kind: Literal["always", "markov", "trace"] = "always"
    mean_on_s: float = Field(3600.0, gt=0, description="markov: mean on-period")
    mean_off_s: float = Field(600.0, gt=0, description="markov: mean off-period")
    trace: Optional[str] = Field(None, description="trace: FedScale behaviour file (pickle or JSON), relative to the scenario")
    rules = (Needs("kind", ("trace",), values=("trace",), why="the FedScale behaviour file"),)


class SharedLink(Strict):
    name: str
    up_mbps: Optional[float] = Field(None, gt=0, description="shared by uploads from its members; null: unlimited")
    down_mbps: Optional[float] = Field(None, gt=0, description="shared by downloads to its members; null: unlimited")
    links: list[str] = Field(min_length=1, description="link mix names whose clients sit behind it")
    queue_ms: Optional[float] = Field(None, ge=0, description="its buffer in ms of its rate; null: network.queue_ms")


def _shares_sum_to_one(items: list, what: str) -> list:
    total = sum(i.share for i in items)
    if abs(total - 1.0) > 1e-6:
        raise ValueError(f"{what} shares must add up to 1, got {total:g}")
    return items


class Population(Strict):
    clients: int = Field(ge=1, le=10_000_000, description="the population (at most ten million)")
    hosts: Optional[int] = Field(None, ge=1, description="client host processes; default: usable cores")
    devices: list[DeviceMix] = Field(min_length=1)
    links: list[LinkMix] = Field(min_length=1)
    availability: Availability = Field(default_factory=Availability)
    capacity_trace: Optional[str] = Field(None, description="FedScale capacity file: per-client ms per sample and kbit/s")
    shared_links: list[SharedLink] = Field(default_factory=list)

    @field_validator("devices")
    @classmethod
    def _devices(cls, v):
        return _shares_sum_to_one(v, "device")

    @field_validator("links")
    @classmethod
    def _links(cls, v):
        return _shares_sum_to_one(v, "link")


class Partition(Strict):
    kind: Literal["iid", "dirichlet", "by_user", "label_skew", "natural"] = Field(
        "iid", description="natural: the writers of a LEAF data set (femnist, shakespeare), merged round-robin into clients")
    alpha: float = Field(0.5, gt=0, description="dirichlet concentration")
    rule: Literal["redraw", "floor", "fedml"] = Field(
        "redraw", description="dirichlet: redraw until min_size holds; floor: FIRMA's floor counts with the remainder to the "
                              "last client; fedml: FedML's LDA (clients full at n/N take no more, seed 10, min_size 10 by default)")
    min_size: int = Field(1, ge=1, description="dirichlet: redraw until every client has this many samples")
    classes_per_client: int = Field(1, ge=1, description="label_skew: K primary classes per client (FIRMA 2.6)")
    users: int = Field(1000, ge=1, description="by_user: users of two labels each, merged round-robin into clients")
    generator: Literal["fedprox", "pairs"] = Field(
        "fedprox", description="by_user: fedprox is FedProx's generate_niid.py (the paper's MNIST; train and test files "
                               "joined, each user split train_share/rest); pairs is the earlier rebuild from the training set")
    size_sigma: Optional[float] = Field(
        None, ge=0, description="by_user: log-normal spread of user sizes; null: 2.0 for fedprox (FedProx's), 1.0 for pairs")
    train_share: float = Field(0.9, gt=0, lt=1, description="by_user fedprox: share of each user's samples it trains on")


class Synthetic(Strict):
    samples: int = Field(2000, ge=1)
    test_samples: int = Field(500, ge=1)
    shape: list[int] = Field(default_factory=lambda: [1, 28, 28], min_length=1)
    classes: int = Field(10, ge=2)


class Task(Strict):
    dataset: str = Field(
        description="read from data_root: mnist and fashion_mnist in torchvision's raw layout, cifar10 as "
                    "cifar-10-batches-py, femnist and shakespeare as LEAF's JSON (NAME/data/train and test); synthetic; "
                    "or your own loader as package.module:loader, called as loader(data_root, **dataset_options) and "
                    "returning (train, test) torch Datasets of (input tensor, int label)")
    dataset_options: dict[str, Any] = Field(default_factory=dict, description="keyword arguments of your own loader")
    model: str = Field("mnist_cnn", description=f"{', '.join(MODELS)}, or your own factory as package.module:factory, "
                                                "called as factory(**model_options) and returning a torch.nn.Module")
    model_options: dict[str, Any] = Field(default_factory=dict, description="keyword arguments of your own model factory")
    partition: Partition = Field(default_factory=Partition)
    feature_noise: float = Field(
        0.0, ge=0, description="feature skew: client i of N trains on inputs with fixed noise N(0, (this x (i+1)/N)^2)")
    data_root: Optional[str] = None
    download: Union[Literal["auto"], bool] = Field(
        "auto", description="auto: fetch a missing public data set (MNIST, Fashion-MNIST, CIFAR-10) into the data root, "
                            "verified by checksum; true: the same; false: never (a missing one is an error)")
    synthetic: Synthetic = Field(default_factory=Synthetic)
    device: str = Field(
        "auto", description="where hosts train: auto (CUDA when a GPU is visible, else the CPU; the run says which), "
                            "cpu, cuda (hosts spread over the visible GPUs) or cuda:N. The server evaluates on the CPU")
    gpu_memory_fraction: Optional[float] = Field(
        None, gt=0, le=1, description="cap on each host's share of its GPU's memory; null: the GPU's hosts share it equally")

    @field_validator("device")
    @classmethod
    def _device(cls, v):
        return check_spec(v)

    @field_validator("dataset")
    @classmethod
    def _dataset(cls, v):
        if is_import_path(v):
            resolve_callable(v)  # a PluginError is a ValueError: one line naming the key
        elif v not in DATASETS:
            raise ValueError(f"unknown dataset; use one of {', '.join(DATASETS)} or package.module:loader")
        return v

    @field_validator("model")
    @classmethod
    def _model(cls, v):
        if not is_import_path(v) and v not in MODELS:
            raise ValueError(f"unknown model; use one of {', '.join(MODELS)} or package.module:factory")
        return v

    rules = (OwnOptions("dataset_options", "dataset", "keyword arguments of your own dataset (package.module:name), not of {value}"),
             OwnOptions("model_options", "model", "keyword arguments of your own model (package.module:name), not of {value}"))

    @model_validator(mode="after")
    def _own_model(self):
        """Your factory must give a torch.nn.Module."""
        if is_import_path(self.model):
            try:
                user_model(self.model, self.model_options)
            except PluginError as exc:
                raise ValueError(f"task.model: {exc}") from None
        return self

    @model_validator(mode="after")
    def _writers(self):
        leaf = self.dataset in ("femnist", "shakespeare")
        if leaf and self.partition.kind != "natural":
            raise ValueError(f"task.partition.kind: {self.dataset} comes split by writer; use kind: natural, got {self.partition.kind!r}")
        if self.partition.kind == "natural" and not leaf:
            raise ValueError(f"task.partition.kind natural splits LEAF data by writer; {self.dataset} has no writers")
        if (self.model == "char_lstm") != (self.dataset == "shakespeare") and not is_import_path(self.model):
            raise ValueError(f"task.model: char_lstm is the model for shakespeare (characters in, the next one out), "
                             f"got model {self.model!r} on {self.dataset!r}")
        return self


class ServerLink(Strict):
    up_mbps: Optional[float] = Field(None, gt=0, description="null: unlimited")
    down_mbps: Optional[float] = Field(None, gt=0, description="null: unlimited")
    latency_ms: float = Field(0.0, ge=0)
    queue_ms: Optional[float] = Field(None, ge=0, description="its buffer in ms of its rate; null: network.queue_ms")
    congestion_control: Optional[CongestionControlName] = Field(
        None, description="what the server's (or an edge aggregator's) downloads are sent with (tcp transport): cubic, "
                          "bbr, reno or package.module:Class; null: network.tcp.congestion_control")


class Server(Strict):
    link: ServerLink = Field(default_factory=ServerLink)
    aggregate_ms: float = Field(0.0, ge=0)


class Hierarchy(Strict):
    """topology: hierarchical (HierFAVG, Liu et al. 2020): clients -> their edge aggregator every
    round, edges -> the cloud server every edge_rounds rounds."""
    edges: Union[Literal["shared_links"], int] = Field(
        "shared_links", description="shared_links: one edge aggregator per population.shared_links entry (a cell tower "
                                    "or Wi-Fi site; its shared link becomes the edge's backhaul to the cloud); N: N edges, "
                                    "client i on edge i mod N")
    edge_rounds: int = Field(2, ge=1, description="k: client-edge rounds per edge-cloud round; `rounds` counts cloud rounds")
    link: ServerLink = Field(default_factory=ServerLink, description="each edge aggregator's own access link")
    codec: CodecSpec = Field(default_factory=lambda: CodecSpec(name="fp32"), description="edge <-> cloud, both ways")


class Selection(Strict):
    clients_per_round: Optional[int] = Field(None, ge=1, description="P; or give fraction")
    fraction: Optional[float] = Field(None, gt=0, le=1, description="P = max(1, round(fraction * clients))")
    policy: str = Field("random", description="random, resource_aware, fastest, oort, or your own Selector subclass as "
                                              "package.module:Class (its options in selection.options)")
    options: dict[str, Any] = Field(default_factory=dict, description="your own selection policy's options")
    over_selection: float = Field(1.0, ge=1, description="ask ceil(P * this) clients")
    checkin: bool = Field(False, description="clients check in when they come online; only they can be selected")
    checkin_wait_s: float = Field(5.0, ge=0, description="collect check-ins this long before a round with nobody to ask")
    min_battery: float = Field(0.0, ge=0, le=1, description="resource_aware: battery fraction (charging devices pass)")
    max_cpu_load: float = Field(1.0, ge=0, le=1, description="resource_aware")
    min_up_mbps: float = Field(0.0, ge=0, description="resource_aware")
    explore: float = Field(0.1, ge=0, le=1, description="fastest: share of the selection drawn at random")
    oort: Oort.Options = Field(default_factory=Oort.Options, description="policy oort's parameters")
    min_clients: int = Field(1, ge=1, description="a round needs this many eligible clients (checked in, meeting the thresholds)")
    wait_s: float = Field(300.0, ge=0, description="with fewer, wait this long (emulated, for check-ins), then run with "
                                                   "whoever is eligible or skip the round (no_eligible_clients incident)")

    rules = (OneOf("clients_per_round", "fraction"),
             OwnOptions("options", "policy", "the options of your own policy (package.module:Class); {value}'s are keys of selection"))

    @field_validator("policy")
    @classmethod
    def _policy(cls, v):
        selector_class(v)  # a PluginError is a ValueError: one line naming the key
        return v

    @model_validator(mode="after")
    def _policy_options(self):
        """Your own policy's options are selection.options (its rules); a built-in one's are its own keys here."""
        try:
            self.build_selector()
        except ValidationError as exc:
            raise ValueError("; ".join(f"selection.options.{'.'.join(str(p) for p in e['loc'])}: {_friendly(e['msg'])}"
                                       for e in exc.errors())) from None
        return self

    def build_selector(self) -> Selector:
        """The policy with its options: selection.options for your own; for a built-in one, the keys of
        selection named as its options' fields, or the mapping selection.<policy> (oort's)."""
        cls = selector_class(self.policy)
        fields = type(self).model_fields
        if is_import_path(self.policy):
            return cls(self.options)
        own = getattr(self, cls.name) if cls.name in fields else None
        if isinstance(own, BaseModel):
            return cls(own.model_dump())
        return cls({k: getattr(self, k) for k in cls.Options.model_fields if k in fields})

    def per_round(self, clients: int) -> int:
        return self.clients_per_round or max(1, round(self.fraction * clients))


class RoundPolicy(Strict):
    policy: Literal["all", "first_k"] = Field("all", description="first_k: close at P updates (with over-selection)")
    timeout_s: Optional[float] = Field(None, gt=0, description="round deadline; null waits for every selected client")
    notify_closed: bool = Field(
        False, description="when a round closes, the server tells the selected clients it did not hear from (a small "
                           "message through the network): they stop and upload nothing, instead of finishing and "
                           "uploading an update the server discards")


class CodecSpec(BaseModel):
    """{name: CODEC, **its parameters}; error_feedback belongs to the sender, not to the codec."""
    model_config = ConfigDict(extra="allow")
    name: str
    error_feedback: bool = Field(
        False, description="upload only: the client keeps what compression dropped and adds it to its next update "
                           "(sent as a delta); the residual is lost when the device goes offline")

    layers: dict[str, dict] = Field(
        default_factory=dict, description="mixed precision: tensor-name pattern (fnmatch, e.g. 'net.1.*') -> codec spec; "
                                          "the first matching pattern wins, other tensors take this codec")
    rules: ClassVar[tuple] = (FeedbackNeedsContraction(),)

    def build(self):
        return make_codec(self.model_dump(exclude={"error_feedback", "layers"}))

    def named_codecs(self) -> list[tuple[str, Any]]:
        """(a label, the codec) for this codec and each per-layer one."""
        return [(self.name, self.build())] + [(f"layers[{k!r}] {v.get('name')}", make_codec(v)) for k, v in self.layers.items()]

    def sends_updates(self) -> bool:
        """Whether what goes through it is an update: a codec that encodes deltas, or error feedback."""
        return self.error_feedback or any(codec.encodes_delta for _, codec in self.named_codecs())

    def build_layers(self, names) -> dict:
        """Each tensor name that a layer pattern matches -> its codec (the first matching pattern)."""
        import fnmatch

        codecs = {pattern: make_codec(spec) for pattern, spec in self.layers.items()}
        out = {}
        for name in names:
            hit = next((pattern for pattern in codecs if fnmatch.fnmatchcase(name, pattern)), None)
            if hit is not None:
                out[name] = codecs[hit]
        return out

    @model_validator(mode="after")
    def _buildable(self):
        try:
            self.build()
            for pattern, spec in self.layers.items():
                if not isinstance(spec, dict):
                    raise CodecError(f"layers[{pattern!r}]: expected a codec spec such as {{name: int, bits: 8}}")
                try:
                    make_codec(spec)
                except CodecError as exc:
                    raise CodecError(f"layers[{pattern!r}]: {exc}") from None
        except CodecError as exc:
            raise ValueError(str(exc)) from None
        return check_section(self)  # its declared rules, once its codecs are known to build


class Codecs(Strict):
    down: CodecSpec = Field(default_factory=lambda: CodecSpec(name="fp32"))
    up: CodecSpec = Field(default_factory=lambda: CodecSpec(name="fp32"))


class Quantization(Strict):
    schedule: Literal["static", "cosine", "dynamic"] = Field(
        "static", description="static: the codecs' own bits; cosine: Eq. 1.5/1.6; dynamic: cosine x importance (Eq. 1.7)")
    b_min: int = Field(8, ge=2, le=32)
    b_max: int = Field(32, ge=2, le=32)
    lambda_h: float = Field(0.5, ge=0, le=1, description="entropy weight of Eq. 1.7 (released script 0.5; paper text 0.75)")
    horizon: Optional[int] = Field(
        None, ge=1, description="the T of the cosine schedule (Eq. 1.5); null: rounds. A short run with the study's "
                                "horizon is a prefix of it, not the whole schedule squeezed")

    rules = (Ordered("b_min", "b_max"),)


DPSGD_COMPUTE_FACTOR = 5.6  # DP-SGD's per-sample gradients against plain SGD, the CNN on a 2-core CPU (docs/guide/paper.md)


class PrivacySpec(Strict):
    mechanism: Literal["none", "laplace", "gaussian", "dpsgd"] = Field(
        "none", description="laplace/gaussian: the core paper's noise on the weights after training; "
                            "dpsgd: per-sample clipping and Gaussian noise at every step (Abadi et al. 2016)")
    epsilon: Optional[float] = Field(None, gt=0, description="laplace/gaussian: the budget; dpsgd reports what it spends")
    delta: float = Field(0.0, ge=0, lt=1, description="gaussian only")
    clip: Optional[float] = Field(
        None, gt=0, description="gradient-norm threshold xi: L1 for laplace, L2 for gaussian; dpsgd: per-sample L2 bound C")
    noise_multiplier: Optional[float] = Field(None, gt=0, description="dpsgd: sigma, the noise std is sigma * clip")
    sampling: Literal["poisson", "shuffle"] = Field(
        "poisson", description="dpsgd: poisson (each sample in each step with probability B/n, what the RDP accountant "
                               "assumes) or shuffle (fixed batches; accounted without sampling amplification)")
    noise_factor: Literal["code", "paper"] = Field("code", description="c_T of Eq. 1.11: code (T/E)(P/N), paper T/P")
    horizon: Optional[int] = Field(
        None, ge=1, description="the T of c_T (Eq. 1.11: each round spends epsilon / c_T); null: rounds. A short run with "
                                "the study's horizon spends per round what the whole study would")
    compute_factor: Optional[float] = Field(
        None, gt=0, description="a training session's modelled time under this mechanism relative to plain SGD; null: "
                                f"{DPSGD_COMPUTE_FACTOR} for dpsgd (per-sample gradients of the CNN, measured on this project's "
                                "2-core CPU: docs/guide/paper.md, 'DP-SGD beside the Laplace pipeline'), 1 otherwise")
    accounting_delta: float = Field(
        1e-5, gt=0, lt=1, description="the delta at which summary.json converts each client's composed zCDP to (epsilon, delta)")
    calibration: Literal["paper", "worst_case"] = Field(
        "paper", description="laplace/gaussian: the sensitivity the noise is calibrated to. paper: Eq. 1.10's, from an "
                             "estimated Lipschitz constant (a heuristic: the ledger says so); worst_case: 2 lr clip per local "
                             "step over every step of the session, a bound on what one record can change (proven, "
                             "substitution)")

    @property
    def resolved_compute_factor(self) -> float:
        if self.compute_factor is not None:
            return self.compute_factor
        return DPSGD_COMPUTE_FACTOR if self.mechanism == "dpsgd" else 1.0

    rules = (
        Needs("mechanism", ("clip", "noise_multiplier"), values=("dpsgd",)),
        OnlyWhen("epsilon", "mechanism", ("none", "laplace", "gaussian"),
                 why="dpsgd spends what clip, noise_multiplier, sampling and the steps give; the run reports it "
                     "(clients.csv dp_epsilon, summary.json privacy_spent)"),
        OnlyWhen("noise_multiplier", "mechanism", ("dpsgd",)),
        OnlyWhen("calibration", "mechanism", ("laplace", "gaussian"), value="worst_case"),
        Needs("mechanism", ("epsilon", "clip"), values=("laplace", "gaussian")),
    )

    @model_validator(mode="after")
    def _gaussian_delta(self):
        if self.mechanism == "gaussian" and self.delta <= 0:
            raise ValueError("mechanism gaussian needs 0 < delta < 1")
        return self


class CodecTimeSpec(Strict):
    """Whole-model seconds of a client's codec work on the host that measured them (node/codec_cost.py)."""
    host_ms_per_sample: float = Field(gt=0, description="the host's training time per sample, one thread")
    decode_s: dict[int, float] = Field(description="decoding the task's model, by download bit-length (0: no bits)")
    encode_s: dict[int, float] = Field(description="encoding the update, by upload bit-length (0: no bits)")
    noise_s: float = Field(0.0, ge=0, description="the local DP noise on the weights")

    @field_validator("decode_s", "encode_s")
    @classmethod
    def _non_empty(cls, table):
        if not table or any(v < 0 for v in table.values()):
            raise ValueError("needs at least one bit-length, each with seconds >= 0")
        return table


class Firma(Strict):
    """FibFL, FibFL+, FibFL++ (docs/algorithms.md part 2); defaults are the released code's FIBFL_CFG."""
    variant: Literal["fibfl", "fibfl+", "fibfl++"] = "fibfl++"
    epochs_head: int = Field(1, ge=0, description="E_h: head-only epochs per round")
    epochs_extractor: int = Field(20, ge=0, description="E_e: extractor-only epochs per round")
    gamma: float = Field(0.5, ge=0, le=1, description="self-retention of FibFL and FibFL+")
    gamma_start: float = Field(0.4, ge=0, le=1, description="FibFL++: retention at the first main round")
    gamma_end: float = Field(0.05, ge=0, le=1, description="FibFL++: retention at the last round")
    tau: float = Field(0.35, ge=0, le=1, description="accuracy gate (FibFL+ and FibFL++)")
    ordering: Literal["auto", "identity", "two_opt"] = Field(
        "auto", description="ring order: auto is 2-opt for FibFL++ and identity for the others")
    pass_timeout_s: Optional[float] = Field(
        None, gt=0, description="go on without a neighbour silent this long after a pass began; null: wait (a ring of always-on devices)")
    init: Literal["independent", "shared"] = Field(
        "independent", description="independent: each client starts from its own random model, as FIRMA's code does; shared: all from one")
    warmup_aggregator: Literal["server", "peer"] = Field(
        "server", description="FibFL++'s warm-up FedAvg: server, an aggregator actor with server.link (FIRMA's central "
                              "FedAvg before the gossip); peer, the first client on the ring, through its access link")


RING_ALGORITHMS = ("fibfl",)  # run by the ring topology, not by a server strategy
FLOWER = "flower"  # a Flower app's own ServerApp and ClientApp (node/flower/)
NOT_STRATEGIES = (*RING_ALGORITHMS, FLOWER)


class FlowerMetrics(Strict):
    """Which of the replies' metrics fill rounds.csv (weighted by the samples metric, as Flower's
    strategies aggregate them)."""
    train_loss: str = "train_loss"
    accuracy: str = "eval_acc"
    test_loss: str = "eval_loss"


class FlowerSpec(Strict):
    app: Optional[str] = Field(None, description="a Flower app directory (with pyproject.toml), relative to the scenario "
                                                 "file or absolute; or a ServerApp as module:attribute")
    server_app: Optional[str] = Field(None, description="module:attribute of the ServerApp (default: the app's own)")
    client_app: Optional[str] = Field(None, description="module:attribute of the ClientApp (default: the app's own)")
    run_config: dict[str, Union[bool, int, float, str]] = Field(
        default_factory=dict, description="overrides of the app's [tool.flwr.app.config]")
    samples_metric: str = Field("num-examples", description="the reply metric that says how many samples a client "
                                                            "trained on (its compute time, and the weights)")
    samples: Optional[int] = Field(None, ge=1, description="charged when a reply reports no samples metric; null: the "
                                                           "client's own sample count")
    timeout_s: Optional[float] = Field(None, gt=0, description="caps the app's own timeouts, read as emulated seconds")
    wait_for_nodes_s: float = Field(
        600.0, gt=0, description="emulated seconds the ServerApp may poll for nodes without sending a message before the "
                                 "run ends (status no_clients, exit 3, or failed after rounds): Flower's strategies wait "
                                 "for min_available_nodes for ever")
    metrics: FlowerMetrics = Field(default_factory=FlowerMetrics)
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        "WARNING", description="Flower's own log (logger flwr) in the server and host processes; INFO shows its rounds")


class Algorithm(Strict):
    name: str = Field(
        "fedavg", description=f"a registered strategy on a star ({', '.join(sorted(REGISTRY))}); fibfl (the FIRMA family) on a ring")
    options: dict[str, Any] = Field(
        default_factory=dict, description="the strategy's own options (each strategy validates its own; fedalign's are algorithm.fedalign)")
    local_epochs: int = Field(1, ge=1)
    batch_size: int = Field(32, ge=1)
    lr: float = Field(0.05, gt=0)
    train: bool = Field(True, description="false: communication only; clients return the model unchanged")
    shuffle: Literal["every_epoch", "once"] = Field("every_epoch", description="once: fixed batches replayed every epoch")
    prox_mu: Optional[float] = Field(None, description="removed: FedProx is the strategy fedprox (options.mu)")
    max_samples_per_round: Optional[int] = Field(
        None, ge=1, description="a client trains on at most this many of its samples per round (a fresh seeded subset) "
                                "and is weighted by them; null: all of them")
    cohort: Union[Literal["auto", "off"], Annotated[int, Field(ge=1)]] = Field(
        "auto", description="train up to N clients of a host together as one batched cohort (wall clock only: emulated "
                            "time and bytes are unchanged); auto: 32 on a GPU, off on a CPU; off")
    charge_codec_time: bool = Field(
        False, description="charge each client task the device's time to decode the model, noise it and encode the "
                           "update: measured on this machine before the run, scaled by the device's speed")
    codec_time: Optional[CodecTimeSpec] = Field(
        None, description="the measured table; null: measure it (the run's scenario.yaml pins what was measured)")
    codec: Codecs = Field(default_factory=Codecs)
    quantization: Quantization = Field(default_factory=Quantization)
    privacy: PrivacySpec = Field(default_factory=PrivacySpec)
    firma: Firma = Field(default_factory=Firma)
    fedalign: FedAlign.Options = Field(default_factory=FedAlign.Options)
    flower: FlowerSpec = Field(default_factory=FlowerSpec)
    secure_aggregation: SecureAggregationSpec = Field(
        default_factory=SecureAggregationSpec,
        description="the server sees only the cohort's sum: SecAgg or SecAgg+ as messages through the network")
    rules = (OnlyWhen("codec_time", "charge_codec_time", (True,),
                      why="a measured table is used only with charge_codec_time: true"),)

    @field_validator("prox_mu")
    @classmethod
    def _prox_mu_removed(cls, v):
        if v is not None:
            raise ValueError(f"removed: FedProx is the strategy fedprox; write algorithm: {{name: fedprox, options: "
                             f"{{mu: {v}}}}} instead")
        return v

    @field_validator("cohort", mode="before")
    @classmethod
    def _cohort_words(cls, value):
        """YAML reads a bare off/on as a boolean."""
        if isinstance(value, bool):
            return "auto" if value else "off"
        return value


    @model_validator(mode="after")
    def _strategy_options(self):
        """The name is a registered strategy (or the ring's fibfl) and its options are its own (the
        algorithm's Fits refuses options given where its options are not: emulator/rules.py)."""
        if self.name in RING_ALGORITHMS:
            return self
        if self.name == FLOWER:
            if not self.flower.app and not (self.flower.server_app and self.flower.client_app):
                raise ValueError("flower.app: name the Flower app (a directory with pyproject.toml, or module:attribute)")
            return self
        try:
            cls = strategy_class(self.name)
        except StrategyError as exc:
            ring = "" if is_import_path(self.name) else f", or {', '.join(RING_ALGORITHMS)} on a ring"
            raise ValueError(f"name: {exc}{ring}") from None
        if cls.options_key != "options":
            return self
        try:
            self.options = cls.Options.model_validate(self.options).model_dump()
        except ValidationError as exc:
            lines = [f"options.{'.'.join(str(p) for p in e['loc'])}: {_friendly(e['msg'])}"
                     + ("" if e["type"] in ("missing", "extra_forbidden") else f", got {e.get('input')!r}")
                     for e in exc.errors()]
            raise ValueError("; ".join(lines)) from None
        return self

    @model_validator(mode="after")
    def _adaptive_needs_int(self):
        if self.quantization.schedule != "static":
            for direction in ("down", "up"):
                if getattr(self.codec, direction).name != "int":
                    raise ValueError(f"quantization.schedule {self.quantization.schedule} sets the bits of int codecs; "
                                     f"codec.{direction} is {getattr(self.codec, direction).name!r}")
        return self


class Eval(Strict):
    every: int = Field(1, ge=0, description="evaluate every N rounds (and after the last); 0: never")
    split: Literal["global", "clients"] = Field(
        "global", description="global: the test set; clients: mean over clients of the accuracy on each one's own test split")
    max_samples: Optional[int] = Field(None, ge=1)
    target_accuracy: Optional[float] = Field(None, gt=0, le=1)


class TcpModel(Strict):
    """Linux's defaults (emulator/flows/transport.py says what is approximated)."""
    initcwnd: int = Field(10, ge=1, description="initial congestion window in segments (RFC 6928)")
    beta: float = Field(0.7, gt=0, lt=1, description="CUBIC's multiplicative decrease")
    cubic_c: float = Field(0.4, gt=0, description="CUBIC's C, in segments per second cubed")
    rwnd_bytes: int = Field(3 * 2**20, ge=1, description="receive window ceiling (Linux autotuning with tcp_rmem max 6 MiB)")
    restart_after_idle: bool = Field(True, description="tcp_slow_start_after_idle: decay the window of an idle connection")
    hystart: bool = Field(True, description="HyStart's ACK-train exit from slow start (Linux CUBIC's default)")
    growth_step: float = Field(
        0.05, gt=0, le=1, description="a window-limited flow's rate steps when CUBIC has grown its window by this fraction")
    congestion_control: CongestionControlName = Field(
        "cubic", description="every sender's congestion control unless its device profile or link says otherwise: a "
                             "registered one (cubic, bbr, reno; emulator/flows/congestion.py) or your own "
                             "CongestionControl subclass as package.module:Class")


class NetworkModel(Strict):
    transport: Literal["tcp", "fluid"] = Field(
        "tcp", description="tcp: congestion window per connection (slow start, idle restart, CUBIC, loss recovery, "
                           "queues); fluid: every transfer at its max-min fair rate from its first byte")
    tcp: TcpModel = Field(default_factory=TcpModel)
    queue_ms: float = Field(100.0, ge=0, description="bottleneck buffer of links that name none, in ms of the link's rate")
    mss: int = Field(1448, ge=0, description="TCP payload bytes per segment; 0 disables framing")
    segment_overhead: int = Field(66, ge=0, description="header bytes per segment on the link")
    per_transfer_bytes: int = Field(0, ge=0)
    rto_ms: float = Field(200.0, ge=0, description="minimum RTO; fluid: the delay each lost segment costs")
    flow_solver: Literal["scratch", "incremental"] = Field(
        "scratch", description="scratch: max-min rates filled again over every flow at every change; incremental: "
                               "only what a change moves (emulator/flows/levelflows.py), the same times to rounding, for "
                               "thousands of concurrent flows; fluid or tcp, static or trace-driven links")

    rules = (
        OnlyWhen("mss", "transport", ("fluid",), value=0,
                 why="the tcp transport counts its window in segments, so mss must be > 0 (or use transport: fluid)"),
    )


class Fault(Strict):
    kind: Literal["truncate", "link_down"] = Field(
        description="truncate: every message the actor sends loses its last payload byte; link_down: its links carry nothing")
    actor: str = Field(description="'server' or a client name such as c0003")
    at_s: float = Field(0.0, ge=0, description="emulated time the fault starts")
    duration_s: Optional[float] = Field(None, gt=0, description="null: until the end of the run")


class Clock(Strict):
    mode: Literal["virtual", "realtime"] = "virtual"
    speedup: float = Field(1.0, gt=0, description="realtime: emulated seconds per wall second")
    lag_bound_s: float = Field(0.1, gt=0, description="realtime: a run whose worst lag exceeds this (wall s) is not faithful")

    def fits(self, sc) -> Fits:
        """Both modes take checkpoints: in realtime the emulated clock stands still while one is
        written and goes on from it when the run resumes (emulator/checkpoints.py)."""
        return Fits(who=f"clock.mode {self.mode}")


class Output(Strict):
    dir: str = "runs"


class Run(Strict):
    stall_timeout_s: float = Field(600.0, gt=0, description="abort if nothing happens for this long (wall time)")
    peer_timeout_s: Optional[float] = Field(
        30.0, gt=0, description="a host or server silent this long (wall s; no heartbeat) is declared lost, killed, and "
                                "handled like a killed host; doubled past a job's running time; null: never")
    checkpoint_every: Optional[int] = Field(
        None, ge=1, description="write RUN_DIR/checkpoint after every this many rounds (at the round's end, when no "
                                "client is still working; a ring's clients meet at a barrier for it, FedBuff drains); "
                                "`python -m emulator resume RUN_DIR` continues from it")
    device_log: Literal["summary", "full"] = Field(
        "summary", description="devices.csv: summary, a row per device and round it had events in (counts by event, "
                               "energy, battery after; a round's rows once it is over); full, a row per event as it "
                               "happens (every draw of energy)")
    trace: bool = Field(False, description="write RUN_DIR/trace.json at the end: the run as a timeline for Perfetto UI "
                                           "or chrome://tracing (emulator/tracefile.py)")
    speculate: Optional[bool] = Field(None, description="removed: speculation saved under 10 % of the flagship's "
                                                         "wall time (docs/2026-12-06-house.md)")

    @field_validator("speculate")
    @classmethod
    def _speculation_removed(cls, v):
        if v is not None:
            raise ValueError("removed: hosts no longer train tasks ahead of their delivery (it saved under 10 % of the "
                             "flagship's wall time: 9.6 % over five interleaved pairs); delete the key")
        return v


class Scenario(Strict):
    name: str = "scenario"
    profiles: Optional[str] = Field(None, description="device/link profile library; default scenarios/profiles.yaml")
    seed: int = Field(0, ge=0, le=2**32 - 1, description="the run's seed: every random draw of the world and the run "
                                                         "derives from it (32 bits: FedProx's split seeds numpy's "
                                                         "legacy generator with it, as its authors did)")
    rounds: int = Field(ge=1)
    clock: Clock = Field(default_factory=Clock)
    task: Task
    population: Population
    server: Server = Field(default_factory=Server)
    topology: Literal["star", "ring", "hierarchical"] = Field(
        "star", description="star: a server; ring: serverless gossip between ring neighbours; hierarchical: clients -> edge "
                            "aggregators -> a cloud server (see hierarchy)")
    hierarchy: Optional[Hierarchy] = Field(None, description="topology hierarchical: its edges")
    selection: Selection = Field(default_factory=lambda: Selection(fraction=1.0))
    round: RoundPolicy = Field(default_factory=RoundPolicy)
    algorithm: Algorithm = Field(default_factory=Algorithm)
    eval: Eval = Field(default_factory=Eval)
    network: NetworkModel = Field(default_factory=NetworkModel)
    output: Output = Field(default_factory=Output)
    run: Run = Field(default_factory=Run)
    faults: list[Fault] = Field(default_factory=list)

    @model_validator(mode="after")
    def _references(self):
        names = {lk.name for lk in self.population.links}
        for i, shared in enumerate(self.population.shared_links):
            for name in shared.links:
                if name not in names:
                    raise ValueError(f"population.shared_links[{i}].links: no link mix named {name!r} (have {sorted(names)})")
        return self

    @model_validator(mode="after")
    def _hierarchy_edges(self):
        if self.topology != "hierarchical":
            return self
        if self.hierarchy is None:
            self.hierarchy = Hierarchy()
        edges = self.hierarchy.edges
        if edges == "shared_links" and not self.population.shared_links:
            raise ValueError("hierarchy.edges: shared_links needs population.shared_links (one edge per entry), "
                             "or give a number of edges")
        if isinstance(edges, int) and not 1 <= edges <= self.population.clients:
            raise ValueError(f"hierarchy.edges: between 1 and population.clients ({self.population.clients}), got {edges}")
        return self

    @model_validator(mode="after")
    def _parts_fit(self):
        """What the topology, the algorithm, the clock mode and the model declare they work with
        (emulator/rules.py): the first setting one of them refuses, in one line naming its key."""
        refused = scenario_refusals(self, self.parts())
        if refused:
            raise ValueError(refused[0])
        return self

    def parts(self) -> list[Fits]:
        return [TOPOLOGIES[self.topology].fits(self), algorithm_fits(self), self.clock.fits(self),
                _model_fits(self.task.model), selector_fits(self), secure_fits(self)]

    @model_validator(mode="after")
    def _downloads_keep_no_error_feedback(self):
        if self.algorithm.codec.down.error_feedback:
            raise ValueError("algorithm.codec.down.error_feedback: error feedback is kept by the clients on their uploads "
                             "(algorithm.codec.up.error_feedback)")
        return self

    @model_validator(mode="after")
    def _selection_fits(self):
        if (self.selection.clients_per_round or 0) > self.population.clients:
            raise ValueError(
                f"selection.clients_per_round ({self.selection.clients_per_round}) exceeds population.clients ({self.population.clients})"
            )
        return self


def _model_fits(model: str) -> Fits:
    """A model without per-sample gradients cannot run DP-SGD (node/models.py says which and why)."""
    if model not in NO_PER_SAMPLE_GRADIENTS:
        return Fits(who=f"task.model {model}")
    return Fits(who=f"task.model {model}", privacy=("none", "laplace", "gaussian"),
                privacy_why=f"dpsgd needs per-sample gradients: {model} has {NO_PER_SAMPLE_GRADIENTS[model]}; "
                            f"use mnist_cnn, mlp or firma_mlp")


# ---- loading -----------------------------------------------------------------------------------
def _path(loc: tuple) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


_FRIENDLY = [
    (re.compile(r"^Extra inputs are not permitted"), "unknown key"),
    (re.compile(r"^Field required"), "required key is missing"),
    (re.compile(r"^Input should be greater than or equal to (.*)"), r"must be >= \1"),
    (re.compile(r"^Input should be greater than (.*)"), r"must be > \1"),
    (re.compile(r"^Input should be less than or equal to (.*)"), r"must be <= \1"),
    (re.compile(r"^Value error, "), ""),
]


def _friendly(msg: str) -> str:
    for pattern, repl in _FRIENDLY:
        if pattern.search(msg):
            return pattern.sub(repl, msg)
    return msg[0].lower() + msg[1:] if msg else msg


def format_errors(source: str, exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and (p.startswith("function-") or p.startswith("literal["))))
        # Drop the pseudo-location pydantic adds for tagged unions and model validators.
        msg = _friendly(err["msg"])
        got = "" if err["type"] in ("missing", "extra_forbidden") or isinstance(err.get("input"), dict) else f", got {err.get('input')!r}"
        if err["type"] == "extra_forbidden":
            got = f" (value {err.get('input')!r})"
        where = _path(loc)
        # a model validator's message that names its own key path (task.model: ...) is not prefixed twice
        if loc and re.match(rf"{re.escape(where)}[.:\[]", msg) or not loc and re.match(r"[a-z_]+(\.[a-z_\[\]0-9']+)*: ", msg):
            where, msg = msg.split(": ", 1) if ": " in msg else (where, msg)
        elif loc and isinstance(err.get("ctx", {}).get("error"), SectionRefusal) and re.match(r"[a-z_]+: ", msg):
            # a section's declared rule names one of its own fields
            field_name, msg = msg.split(": ", 1)
            where = f"{where}.{field_name}"
        lines.append(f"{source}: {where}: {msg}{got}")
    return "\n".join(lines)


def _set_path(data: dict, dotted: str, value: Any) -> None:
    parts = re.findall(r"[^.\[\]]+|\[\d+\]", dotted)
    if not parts:
        raise ScenarioError(f"--set {dotted}: empty key")
    node: Any = data
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        key: Any = int(part[1:-1]) if part.startswith("[") else part
        if isinstance(key, int):
            if not isinstance(node, list) or key >= len(node):
                raise ScenarioError(f"--set {dotted}: {_path(tuple(parts[:i]))} has no item {key}")
        elif not isinstance(node, dict):
            raise ScenarioError(f"--set {dotted}: cannot set a key inside a non-mapping")
        if last:
            node[key] = value
        else:
            if isinstance(key, str) and key not in node:
                node[key] = {}
            node = node[key]


def load_scenario(path: str | Path, overrides: list[str] = ()) -> tuple[Scenario, dict]:
    """Read, apply `key=value` overrides, validate. Returns (scenario, resolved plain dict)."""
    path = Path(path)
    source = str(path)
    raw = read_mapping(path, source, "the top level must be a mapping of keys")
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ScenarioError(f"--set {item!r}: expected key=value")
        _set_path(raw, key.strip(), yaml.safe_load(value))
    _resolve_profiles(raw, path)
    try:
        scenario = Scenario.model_validate(raw)
    except ValidationError as exc:
        raise ScenarioError(format_errors(source, exc)) from None
    _resolve_paths(scenario, path)
    return scenario, scenario.model_dump(mode="json")


DEFAULT_PROFILES = Path(__file__).resolve().parents[1] / "scenarios" / "profiles.yaml"


def read_mapping(path: Path, label: str, not_a_mapping: str) -> dict:
    """A YAML file whose top level is a mapping; every failure is one ScenarioError naming `label`."""
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ScenarioError(f"{label}: file not found") from None
    except yaml.YAMLError as exc:
        raise ScenarioError(f"{label}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ScenarioError(f"{label}: {not_a_mapping}")
    return data


def load_profiles(path: Path) -> dict:
    return read_mapping(path, f"profiles: {path}", "must map 'devices' and 'links' to profiles")


SPEED_KEYS = {"ms_per_sample", "gflops"}


def _resolve_profiles(raw: dict, scenario_path: Path) -> None:
    """Replace `{profile: NAME, ...}` entries of population.devices/links by the library's fields,
    with the entry's own keys taking precedence."""
    population = raw.get("population")
    if not isinstance(population, dict):
        return
    wanted = [(section, i, entry) for section in ("devices", "links") for i, entry in enumerate(population.get(section) or [])
              if isinstance(entry, dict) and "profile" in entry]
    if not wanted:
        return
    lib_path = Path(raw["profiles"]) if raw.get("profiles") else DEFAULT_PROFILES
    if raw.get("profiles") and not lib_path.is_absolute():
        lib_path = scenario_path.parent / lib_path
    lib = load_profiles(lib_path)
    for section, i, entry in wanted:
        name = entry["profile"]
        if not isinstance(name, str):
            raise ScenarioError(f"population.{section}[{i}].profile: a profile's name, got {name!r}")
        known = lib.get(section) or {}
        if name not in known:
            raise ScenarioError(f"population.{section}[{i}].profile: unknown profile {name!r} in {lib_path} "
                                f"(known: {', '.join(sorted(known))})")
        library = dict(known[name])
        if SPEED_KEYS & set(entry):  # the entry's own speed replaces the profile's, whichever way it is given
            library = {k: v for k, v in library.items() if k not in SPEED_KEYS}
        for direction in ("up", "down"):  # so does a direction's trace its rate
            if f"{direction}_trace" in entry:
                library.pop(f"{direction}_mbps", None)
        merged = {"name": name, **library, **{k: v for k, v in entry.items() if k != "profile"}}
        population[section][i] = merged


def _resolve_paths(sc: "Scenario", scenario_path: Path) -> None:
    """Trace files are named relative to the scenario file."""
    base = scenario_path.parent
    for holder, key in ((sc.population.availability, "trace"), (sc.population, "capacity_trace")):
        value = getattr(holder, key)
        if value and not Path(value).is_absolute():
            setattr(holder, key, str(base / value))
    for mix in sc.population.links:  # link traces that the scenario's folder holds (else: under the data root)
        for spec in (mix.up_trace, mix.down_trace):
            if spec is not None and spec.files is not None:
                patterns = [spec.files] if isinstance(spec.files, str) else spec.files
                local = [str(base / p) if not Path(p).is_absolute() and glob.glob(str(base / p)) else p for p in patterns]
                spec.files = local if isinstance(spec.files, list) else local[0]
    app = sc.algorithm.flower.app  # so is a Flower app directory
    if app and not Path(app).is_absolute() and (base / app).is_dir():
        sc.algorithm.flower.app = str((base / app).resolve())


__all__ = ["Scenario", "ScenarioError", "load_scenario"]

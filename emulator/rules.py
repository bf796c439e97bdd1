"""What the scenario schema refuses, declared rather than written out per combination.

Two kinds of declaration, one check each:

- **Within a section** (a pydantic model of emulator/scenario.py), the section lists `rules` over its
  own fields: `OneOf`, `Needs`, `OnlyWhen`, `Ordered`. `check_section` applies them after the
  section is validated.
- **Across sections**, each part of a run declares a `Fits`: what it runs with and, for each setting
  it does not work with, why. The parts are the topology (emulator/topology.py's classes declare
  theirs), the algorithm (a strategy's flags and Capabilities, node/strategies/base.py; a Flower
  app; the ring's FIRMA family), the clock mode and the model. `scenario_refusals` asks every part
  of a scenario and lists one line per refused setting the scenario uses, naming the key (and the
  value): the schema raises the first.

A new topology, strategy or clock mode declares its Fits; nothing here names it."""
from __future__ import annotations

import math
import operator
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from node.plugins import is_import_path
from node.selection import selector_class
from node.strategies import strategy_class

from .netconfig import client_name_width

UNSET = object()


def _is_set(value: Any) -> bool:
    return value is not None and value is not False


def _words(names: tuple[str, ...]) -> str:
    return " and ".join(names)


# ---- within a section -----------------------------------------------------------------------
@dataclass(frozen=True)
class OneOf:
    """Exactly one of two fields is given."""

    first: str
    second: str

    def refusal(self, m: Any) -> str | None:
        if _is_set(getattr(m, self.first)) == _is_set(getattr(m, self.second)):
            return f"give exactly one of {self.first} and {self.second}"
        return None


@dataclass(frozen=True)
class Needs:
    """`field` given (or, with `values`, equal to one of them) needs each of `required` given."""

    field: str
    required: tuple[str, ...]
    values: tuple = ()
    why: str = ""

    def refusal(self, m: Any) -> str | None:
        value = getattr(m, self.field)
        applies = value in self.values if self.values else _is_set(value)
        if not applies or all(_is_set(getattr(m, r)) for r in self.required):
            return None
        head = f"{self.field} {value} needs" if self.values else f"{self.field} needs"
        return f"{head} {_words(self.required)}" + (f": {self.why}" if self.why else "")


@dataclass(frozen=True)
class OnlyWhen:
    """`field` given (or equal to `value`) only while `other` is one of `allowed`."""

    field: str
    other: str
    allowed: tuple
    value: Any = UNSET
    why: str = ""

    def refusal(self, m: Any) -> str | None:
        mine = getattr(m, self.field)
        applies = _is_set(mine) if self.value is UNSET else mine == self.value
        theirs = getattr(m, self.other)
        if not applies or theirs in self.allowed:
            return None
        if self.why:
            return f"{self.field}: {self.why}"
        return f"{self.field}: only for {self.other} {' or '.join(map(str, self.allowed))}, got {self.other} {theirs}"


@dataclass(frozen=True)
class OwnOptions:
    """`options` only for a component of one's own (`component` an import path, package.module:name);
    `why` is said otherwise, with {value} the component named."""

    options: str
    component: str
    why: str

    def refusal(self, m: Any) -> str | None:
        value = getattr(m, self.component)
        if not getattr(m, self.options) or is_import_path(value):
            return None
        return f"{self.options}: {self.why.format(value=value)}"


@dataclass(frozen=True)
class Ordered:
    """`low` does not exceed `high`."""

    low: str
    high: str

    def refusal(self, m: Any) -> str | None:
        low, high = getattr(m, self.low), getattr(m, self.high)
        return f"{self.low} ({low}) exceeds {self.high} ({high})" if low > high else None


@dataclass(frozen=True)
class SumBelow:
    """The fields add up to less than `limit` (shares of one whole that must leave room for the rest)."""

    fields: tuple[str, ...]
    limit: float
    why: str = ""

    def refusal(self, m: Any) -> str | None:
        total = sum(getattr(m, name) for name in self.fields)
        if total < self.limit:
            return None
        return f"{' + '.join(self.fields)} is {total:g}, not below {self.limit:g}{self.why}"


class SectionRefusal(ValueError):
    """A section's rule is broken; the message starts with the field it names (the schema's error
    formatter joins it to the section's path)."""


@dataclass(frozen=True)
class FeedbackNeedsContraction:
    """A codec spec's error feedback only with codecs that declare themselves contractive
    (protocol/codecs/base.py): rescaled random-k's residual grows without bound."""

    def refusal(self, m: Any) -> str | None:
        if not m.error_feedback:
            return None
        wild = [label for label, codec in m.named_codecs() if not codec.contractive]
        if not wild:
            return None
        return (f"error_feedback: {wild[0]} is not contractive (it rescales what it keeps), so the residual grows "
                f"without bound; use topk or threshold with error feedback")


def check_section(model: Any) -> Any:
    """A section's declared rules, in order; the first broken one is its error."""
    for rule in type(model).rules:
        why = rule.refusal(model)
        if why is not None:
            raise SectionRefusal(why)
    return model


# ---- across sections ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Fits:
    """What one part of a run works with. `who` names it in messages. A reason (str) refuses the
    setting it is named after whenever the scenario uses it; None accepts it."""

    who: str
    topologies: tuple[str, ...] | None = None  # algorithm.name: runs on these topologies only
    topology_why: str = ""  # said instead of the list, where there is more to say
    algorithms: tuple[str, ...] | None = None  # topology: runs these algorithm.name only
    models: tuple[str, ...] | None = None  # task.model: these only
    models_why: str = ""
    privacy: tuple[str, ...] | None = None  # algorithm.privacy.mechanism: these only
    privacy_why: str = ""
    min_clients: int = 1
    checkpoints: str | None = None  # run.checkpoint_every
    adaptive_bits: str | None = None  # algorithm.quantization.schedule other than static
    selection: str | None = None  # a selection section at all
    scoring_selectors: str | None = None  # selection.policy: one that scores synchronous rounds
    non_filtering_selectors: str | None = None  # selection.policy: one that does more than filter
    over_selection: str | None = None  # selection.over_selection other than 1
    round_policy: str | None = None  # round.policy other than all
    notify_closed: str | None = None  # round.notify_closed
    no_deadline: str | None = None  # round.timeout_s left null
    offline_without_timeout: str | None = None  # devices that go offline with round.timeout_s null
    offline_without_pass_timeout: str | None = None  # ... with algorithm.firma.pass_timeout_s null
    codec_time: str | None = None  # algorithm.charge_codec_time
    upload_error_feedback: str | None = None  # algorithm.codec.up.error_feedback
    layered_uploads: str | None = None  # algorithm.codec.up.layers
    update_codecs: str | None = None  # codecs that send updates (sparsifiers, error feedback), either way
    train_false: str | None = None  # algorithm.train false
    hierarchy: str | None = None  # a hierarchy section
    options_elsewhere: str | None = None  # algorithm.options, where its options live under another key
    secure_aggregation: str | None = None  # algorithm.secure_aggregation.protocol other than none
    lines: tuple[str, ...] = ()  # refusals the part words itself (values across sections), each a whole line
    weights_on: dict[str, str] = field(default_factory=dict)  # a codec's key -> why it carries weights (no sparsifier)


def _uses_offline_devices(sc) -> bool:
    return sc.population.availability.kind != "always"


# each reason of a Fits: the key it refuses, and whether the scenario uses that setting
_SETTINGS: dict[str, tuple[str, Callable[[Any], bool]]] = {
    # a selection other than the default one (a run directory's scenario.yaml writes the defaults out)
    "selection": ("selection", lambda sc: sc.selection != type(sc).model_fields["selection"].get_default(
        call_default_factory=True)),
    "round_policy": ("round.policy", lambda sc: sc.round.policy != "all"),
    "over_selection": ("selection.over_selection", lambda sc: sc.selection.over_selection != 1.0),
    "scoring_selectors": ("selection.policy", lambda sc: selector_class(sc.selection.policy).rounds_only),
    "non_filtering_selectors": ("selection.policy", lambda sc: not selector_class(sc.selection.policy).filters_only),
    "adaptive_bits": ("algorithm.quantization.schedule", lambda sc: sc.algorithm.quantization.schedule != "static"),
    "checkpoints": ("run.checkpoint_every", lambda sc: sc.run.checkpoint_every is not None),
    "no_deadline": ("round.timeout_s", lambda sc: sc.round.timeout_s is None),
    "offline_without_timeout": ("round.timeout_s", lambda sc: _uses_offline_devices(sc) and sc.round.timeout_s is None),
    "offline_without_pass_timeout": ("population.availability",
                                     lambda sc: _uses_offline_devices(sc) and sc.algorithm.firma.pass_timeout_s is None),
    "notify_closed": ("round.notify_closed", lambda sc: sc.round.notify_closed),
    "codec_time": ("algorithm.charge_codec_time", lambda sc: sc.algorithm.charge_codec_time),
    "upload_error_feedback": ("algorithm.codec.up.error_feedback", lambda sc: sc.algorithm.codec.up.error_feedback),
    "layered_uploads": ("algorithm.codec.up.layers", lambda sc: bool(sc.algorithm.codec.up.layers)),
    "train_false": ("algorithm.train", lambda sc: not sc.algorithm.train),
    "hierarchy": ("hierarchy", lambda sc: sc.hierarchy is not None),
    "options_elsewhere": ("algorithm.options", lambda sc: bool(sc.algorithm.options)),
    "secure_aggregation": ("algorithm.secure_aggregation.protocol",
                           lambda sc: sc.algorithm.secure_aggregation.protocol != "none"),
}


def _part_refusals(sc, fits: Fits) -> Iterator[str]:
    """The settings of `sc` that one part refuses, one line each."""
    alg = sc.algorithm
    if fits.algorithms is not None and alg.name not in fits.algorithms:
        yield f"{fits.who} runs algorithm.name {' or '.join(fits.algorithms)}, got {alg.name!r}"
    if fits.topologies is not None and sc.topology not in fits.topologies:
        yield fits.topology_why or f"topology: {fits.who} runs on {' or '.join(fits.topologies)}, not {sc.topology}"
    if sc.population.clients < fits.min_clients:
        yield f"{fits.who} needs at least {fits.min_clients} clients, got population.clients {sc.population.clients}"
    if fits.models is not None and sc.task.model not in fits.models:
        yield (f"{fits.models_why}, got {sc.task.model!r}" if fits.models_why else
               f"task.model: {fits.who} runs with {' or '.join(fits.models)}, not {sc.task.model!r}")
    if fits.privacy is not None and alg.privacy.mechanism not in fits.privacy:
        yield (f"algorithm.privacy.mechanism: {fits.who} works with {', '.join(fits.privacy)}, not "
               f"{alg.privacy.mechanism}" + (f" ({fits.privacy_why})" if fits.privacy_why else ""))
    yield from fits.lines
    for name, (key, used) in _SETTINGS.items():
        why = getattr(fits, name)
        if why is not None and used(sc):
            yield f"{key}: {why}"
    for direction in ("up", "down"):
        spec = getattr(alg.codec, direction)
        if fits.update_codecs is not None and spec.sends_updates():
            yield (f"algorithm.codec.{direction}: {fits.update_codecs}, not with {spec.name}"
                   f"{' and error feedback' if spec.error_feedback else ''}")
    for key, why in fits.weights_on.items():
        spec = operator.attrgetter(key)(sc)
        for label, codec in spec.named_codecs():
            if codec.encodes_delta:
                yield f"{key}: {label} encodes updates (deltas), but {why}; use a dense codec (fp32, fp16, bf16, int)"


def scenario_refusals(sc, parts: list[Fits]) -> list[str]:
    """Every refusal of the scenario's parts, in the order of the parts."""
    return [line for fits in parts for line in _part_refusals(sc, fits)]


# ---- the algorithm's part ------------------------------------------------------------------------
def _own_options(cls, sc) -> dict:
    return dict(getattr(sc.algorithm, cls.options_key)) if cls.options_key != "options" else dict(sc.algorithm.options)


def strategy_fits(name: str, sc) -> Fits:
    """A strategy's Fits, from its flags and its Capabilities (`sc` for the values its reasons name)."""
    cls = strategy_class(name)
    caps = cls.capabilities
    topologies = tuple(caps.topologies)
    topology_why = ""
    if (cls.asynchronous or cls.message_kinds) and "hierarchical" in topologies:
        topologies = tuple(t for t in topologies if t != "hierarchical")
        topology_why = (f"algorithm.name: a hierarchy's edges run synchronous rounds of a one-phase strategy "
                        f"(fedavg, fedprox, fedavgm), not {name}")
    if cls.has_extras() and topologies != ("star",) or cls.has_extras() and cls.asynchronous:
        topologies = tuple(t for t in topologies if t == "star" and not cls.asynchronous)
        topology_why = (f"algorithm.name: {name} sends arrays beside the model, which the synchronous server of "
                        f"topology star carries")
    late = cls.asynchronous or cls.keeps_late
    asynchronous = {}
    if cls.asynchronous:
        asynchronous = dict(
            round_policy=f"{sc.round.policy} closes synchronous rounds; {name} steps every buffer_size updates (leave "
                         f"round.policy at all)",
            over_selection=f"{name} keeps algorithm.options.concurrency clients training; over-selection does not apply",
            scoring_selectors=f"{sc.selection.policy} scores the clients of synchronous rounds; use random, resource_aware "
                              f"or fastest with {name}",
            adaptive_bits=f"{sc.algorithm.quantization.schedule} follows synchronous rounds; use static with {name}",
            offline_without_timeout=f"devices go offline here; {name} needs a per-client timeout to replace a client "
                                    f"that never answers",
        )
    checkpoints = None
    if not caps.checkpoints:
        checkpoints = f"{name}'s state cannot be checkpointed"
    return Fits(
        who=name, topologies=topologies, topology_why=topology_why, privacy=tuple(caps.privacy),
        privacy_why=caps.privacy_why, checkpoints=checkpoints,
        no_deadline=(f"{name} keeps the updates a round's deadline cut off; without a deadline there are none (set one)"
                     if cls.keeps_late else None),
        notify_closed=(f"{name} uses updates that arrive after their round closed; telling their clients to stop would "
                       f"lose them (leave notify_closed false)" if late else None),
        update_codecs=None if caps.delta_codecs else f"{name} works with dense codecs (fp32, fp16, bf16, int) without error feedback",
        upload_error_feedback=None if caps.error_feedback else f"{name} does not keep error feedback on its uploads",
        train_false=None if caps.communication_only else f"{name} needs training (its state comes from it); leave train true",
        options_elsewhere=None if cls.options_key == "options" else f"{name}'s options are algorithm.{cls.options_key}",
        secure_aggregation=cls.secure_sum_why(cls.Options.model_validate(_own_options(cls, sc))),
        **asynchronous,
    )


FIBFL = Fits(
    who="fibfl", topologies=("ring",), topology_why="algorithm.name fibfl runs on topology: ring", models=("firma_mlp",),
    models_why="task.model: algorithm fibfl keeps a private head: task.model must be firma_mlp",
    options_elsewhere="fibfl's options are algorithm.firma",
    secure_aggregation="a ring has no server to aggregate: leave it at none",
)

_FLOWER_PIPELINE = "the core paper's pipeline is not a Flower app's (use Flower's own DP mods)"
FLOWER = Fits(
    who="flower", topologies=("star",),
    topology_why="algorithm.name flower: a Flower app has one ServerApp; it runs on topology star",
    privacy=("none",), privacy_why=f"{_FLOWER_PIPELINE}; leave it at none",
    checkpoints="a Flower app's state lives in its own Python objects; it cannot be checkpointed",
    non_filtering_selectors="a Flower strategy samples its own nodes; only resource_aware's thresholds apply (they "
                            "filter the Grid's nodes)",
    adaptive_bits=f"{_FLOWER_PIPELINE}; leave it at static",
    notify_closed="the synchronous server of topology star tells clients that a round closed; here algorithm.name is flower",
    options_elsewhere="a Flower app's options are algorithm.flower.run_config",
    secure_aggregation="a Flower app runs its own workflows (Flower's SecAggPlusWorkflow); leave it at none",
)
ALGORITHMS = {"fibfl": FIBFL, "flower": FLOWER}  # algorithms that are not strategies of ours


def selector_fits(sc) -> Fits:
    """A selection policy that selects on statistics of the clients' private data, which no DP
    mechanism of the run noises, voids the mechanism's guarantee: it runs without DP only."""
    cls = selector_class(sc.selection.policy)
    if not cls.private_statistics:
        return Fits(who=f"selection.policy {sc.selection.policy}")
    return Fits(who=f"selection.policy {sc.selection.policy}", privacy=("none",),
                privacy_why=f"it selects on {cls.private_statistics}, which no DP mechanism noises: with one, the "
                            f"selection would leak what the mechanism protects")


def secure_fits(sc) -> Fits:
    """Secure aggregation replaces the upload's codec with the cohort's fixed-point vector, and runs
    on a star's synchronous rounds."""
    if sc.algorithm.secure_aggregation.protocol == "none":
        return Fits(who="algorithm.secure_aggregation")
    replaced = "secure aggregation sends each update in the cohort's fixed-point encoding, not through the upload codec"
    return Fits(lines=tuple(_secure_lines(sc)),
        who="algorithm.secure_aggregation", topologies=("star", "hierarchical"),
        topology_why=(f"algorithm.secure_aggregation: runs where a server sums a cohort (topology star, or a "
                      f"hierarchy's edges), not on a {sc.topology}"),
        adaptive_bits=f"{replaced}; its bits are algorithm.secure_aggregation.bits (leave the schedule static)",
        upload_error_feedback=replaced, layered_uploads=replaced,
        round_policy="secure aggregation sums the cohort that sent its masked input; leave round.policy at all",
        scoring_selectors=(f"{sc.selection.policy} scores clients by what their updates report, which secure "
                           f"aggregation hides from the server"),
        offline_without_timeout=("devices go offline here, and secure aggregation waits for the masked inputs until the "
                                 "round's deadline: set one"),
        weights_on={},
    )


def _secure_lines(sc) -> Iterator[str]:
    """What secure aggregation's settings refuse of the rest of the scenario."""
    secure, clients = sc.algorithm.secure_aggregation, sc.population.clients
    cohort = math.ceil(sc.selection.per_round(clients) * sc.selection.over_selection)
    words = secure.bits + max(0, math.ceil(math.log2(max(1, cohort))))
    if words > 32:
        yield (f"algorithm.secure_aggregation.bits: {secure.bits} bits and a cohort of {cohort} need {words}-bit words; "
               f"at most 32 (lower bits to {32 - words + secure.bits} or less)")
    name = sc.algorithm.name
    if name not in ALGORITHMS and strategy_class(name).uniform_weights and secure.weighting == "samples":
        yield (f"algorithm.secure_aggregation.weighting: {name} counts each client once (its sensitivity is its clip); "
               f"set uniform")
    width = client_name_width(clients)
    for client in secure.corrupt_clients:
        if not (re.fullmatch(r"c\d+", client) and len(client) == width + 1 and int(client[1:]) < clients):
            yield (f"algorithm.secure_aggregation.corrupt_clients: no client {client!r} (clients are c{0:0{width}d} .. "
                   f"c{clients - 1:0{width}d})")


def algorithm_fits(sc) -> Fits:
    name = sc.algorithm.name
    return ALGORITHMS[name] if name in ALGORITHMS else strategy_fits(name, sc)

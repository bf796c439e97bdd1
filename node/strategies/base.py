"""The FL algorithm as a plug-in, apart from transport and time.

A Strategy is policy only, both halves of it: on the server, what a round asks of its clients,
what an arriving update does and how the global model moves; on the client, how it turns the
global model into its own, with state of its own that outlives a round (and is checkpointed), and
extra named arrays that travel beside the model both ways (counted on the wire like the model).
It never sees a socket or a clock: the server actor (node/server.py) and the client actor
(node/client.py) drive it, and own selection, timing, codecs and bookkeeping. It declares what it
works with (Capabilities), and the scenario schema refuses the rest from that declaration."""
from __future__ import annotations

import collections.abc
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Mapping

import numpy as np
from pydantic import BaseModel, ConfigDict

from ..plugins import Registry

State = dict[str, np.ndarray]


class Difference(collections.abc.Mapping):
    """new - old, tensor by tensor, each computed when first read: FedAvg never reads a client's
    delta, and for a 1.66M-parameter model making it cost 2 ms per update. Both states are the
    server's own dicts, replaced (never changed in place) when the global model moves."""

    def __init__(self, new: Mapping[str, np.ndarray], old: Mapping[str, np.ndarray]):
        self._new, self._old, self._done = new, old, {}

    def __getitem__(self, name: str) -> np.ndarray:
        value = self._done.get(name)
        if value is None:
            value = self._done[name] = self._new[name] - self._old[name]
        return value

    def __iter__(self):
        return iter(self._new)

    def __len__(self) -> int:
        return len(self._new)


class Options(BaseModel):
    """A strategy's own options (`algorithm.options` in a scenario); unknown keys are errors."""
    model_config = ConfigDict(extra="forbid")


@dataclass
class ClientUpdate:
    """One client's decoded contribution, as the server strategy sees it."""
    client: str
    state: State  # the client's new model (weights)
    delta: State  # state minus the model the client trained from
    weight: float  # its number of training samples
    info: dict[str, Any] = field(default_factory=dict)  # what it reported (loss, bits, ...)
    staleness: int = 0  # server steps taken since the client got its model (asynchronous strategies)
    extras: State = field(default_factory=dict)  # the named arrays it sent beside its model (extras_spec "up")


@dataclass(frozen=True)
class Capabilities:
    """What a strategy works with. The scenario schema refuses any other combination, in one line
    naming the key (emulator/rules.py's strategy_fits)."""
    topologies: tuple[str, ...] = ("star", "hierarchical")
    privacy: tuple[str, ...] = ("none", "laplace", "gaussian", "dpsgd")  # algorithm.privacy.mechanism
    privacy_why: str = ""  # said when a mechanism is refused
    delta_codecs: bool = True  # works with codecs that send updates (sparsifiers, error feedback)
    error_feedback: bool = True  # its uploads may keep error feedback (algorithm.codec.up.error_feedback)
    checkpoints: bool = True  # its state (STATE, and its clients') is data: run.checkpoint_every applies
    communication_only: bool = True  # works with algorithm.train false (clients return the model they got)
    # takes the round's sum from secure aggregation (on_secure_sum) in place of each client's update
    secure_aggregation: bool = False


@dataclass
class ClientStep:
    """What a strategy's client half returns: the model to upload, the training result, the extra
    arrays to send beside it, and the client's state from now on (kept only if the update leaves:
    a round that closed first, or a device that went off, keeps the old one)."""
    state: State
    result: Any
    extras: State = field(default_factory=dict)
    client_state: dict[str, Any] | None = None


class RoundControl:
    """What a strategy may do to the round in progress besides aggregating: refuse a client's
    message (it then counts as failed) and name the round. Given by the server actor."""

    def __init__(self, index: int, selected: list[str], seed: int, reject: Callable[[str, str, str], None],
                 population: int = 0, eligible: int = 0):
        self.index = index
        self.selected = selected
        self.seed = seed
        self.reject = reject  # (client, what, error)
        self.population = population  # the clients the server serves (N)
        self.eligible = eligible or population  # the clients this round selected from (checked in, alive)


# train(state, config, correction=None) -> (state, result): local SGD on the client's data, with a
# correction (parameter name -> array) added to every step's gradient
TrainFn = Callable[..., tuple[State, Any]]


@dataclass
class SessionPlan:
    """How a strategy's client half shapes one training session; None everywhere is the client's
    own session, weighted by what it trained on, uploaded through its channel."""

    indices: np.ndarray | None = None  # what it trains on, as indices into `data`
    data: Any = None  # the data set they index (node.data.Dataset), or a function that makes it when the session runs
    weight: int | None = None  # its aggregation weight (samples)
    # upload(global_state, trained_state, local, indices, rng, info, channel, bits, extras) -> (channel output, privacy
    # release or None); extras: the arrays the strategy sends beside the model (extras_spec "up")
    upload: Callable[..., tuple[Any, Any]] | None = None
    kind: str = "update"  # the message kind the upload goes as (secure aggregation's masked input: sa_masked)
    busy_s: float = 0.0  # full-speed seconds of the device's work besides training (secure aggregation's masks)
    body: dict[str, Any] = field(default_factory=dict)  # fields the upload's body carries besides samples and bits
    hidden: tuple[str, ...] = ()  # of samples and bits, what the body leaves out (the run's records keep them)


class Strategy:
    """Base class: FedAvg's hooks with no aggregation rule. Subclasses register by name."""

    name: ClassVar[str] = ""
    Options: ClassVar[type[Options]] = Options
    asynchronous: ClassVar[bool] = False  # True: the server steps when ready(), dispatching clients as others finish
    uploads_delta: ClassVar[bool] = False  # True: clients send model deltas whatever their codec
    keeps_late: ClassVar[bool] = False  # True: an update a deadline cut off joins a later round, with its staleness
    message_kinds: ClassVar[tuple[str, ...]] = ()  # extra client -> server messages handled by on_message
    client_message_kinds: ClassVar[tuple[str, ...]] = ()  # extra server -> client messages handled by client_on_message
    STATE: ClassVar[tuple[str, ...]] = ()  # attributes that outlive a round (checkpointed)
    options_key: ClassVar[str] = "options"  # where a scenario keeps its options: algorithm.<options_key>
    capabilities: ClassVar[Capabilities] = Capabilities()
    uniform_weights: ClassVar[bool] = False  # True: each client counts once (secure aggregation's weighting: uniform)

    def __init__(self, options: Options | Mapping[str, Any] | None = None, *, seed: int = 0):
        self.options = options if isinstance(options, self.Options) else self.Options.model_validate(dict(options or {}))
        self.seed = seed

    # ---- server side ----------------------------------------------------------------------
    def configure_round(self, control: RoundControl, global_state: State) -> dict[str, Any]:
        """Called as a round starts; returns extra fields for the task every selected client gets."""
        return {}

    def on_update(self, update: ClientUpdate) -> None:
        raise NotImplementedError

    def on_secure_sum(self, state: State, delta: State, weight: float, count: int, extras: State | None = None) -> None:
        """Secure aggregation's one result for the round: the global model moved by the weighted mean
        change of `count` clients whose weights sum to `weight`, and the sums of the arrays they
        sent beside it (extras_spec "up"); the server never sees one client's update. Strategies
        that declare capabilities.secure_aggregation take it; by default as one update of that
        weight carrying the sums, which is what a weighted mean of models (and a sum of arrays)
        does with it."""
        self.on_update(ClientUpdate("secure aggregate", state, delta, weight, {"clients": count}, extras=extras or {}))

    def accepts(self, staleness: int) -> bool:
        """Whether an update this stale is used at all."""
        return True

    def ready(self) -> bool:
        """Asynchronous strategies: whether the server should take a step now."""
        return False

    def aggregate(self, global_state: State) -> State:
        """The next global model from the updates taken since the last call (which it forgets)."""
        raise NotImplementedError

    def on_message(self, msg, control: RoundControl) -> list:
        """A client message of one of `message_kinds`; returns Sends (node.actor.Send)."""
        return []

    def on_lost(self, clients: set[str], control: RoundControl) -> list:
        """Selected clients whose host is gone; returns Sends."""
        return []

    def take_releases(self) -> list:
        """Privacy releases the server half made since the last call (node.accounting.Release: a
        user-level DP step's noise on the aggregate); the server actor puts them in the run's ledger."""
        return []

    def waiting_for(self) -> set[str]:
        """Clients whose messages (other than their update) this round still waits for."""
        return set()

    # ---- client side ----------------------------------------------------------------------

    def local_update(self, state: State, config, train: TrainFn) -> tuple[State, Any]:
        """A client's new model from the global one. `train(state, config)` runs local SGD
        (node.training.LocalTraining config) on the client's data and returns (state, result)."""
        return train(state, config)

    def client_step(self, state: State, config, train: TrainFn, extras: State, client_state: dict[str, Any]) -> ClientStep:
        """The whole client half: from the global model, the arrays the server sent beside it
        (extras_spec "down") and this client's own state (client_state() at first), the model to
        upload and what goes with it. `train(state, config, correction=None)` runs local SGD; a
        correction (name -> array) is added to every step's gradient of those parameters. By
        default: local_update, nothing extra, no state."""
        new_state, result = self.local_update(state, config, train)
        return ClientStep(new_state, result)

    def client_release(self, global_state: State, new_state: State, task_body: dict, rng: np.random.Generator,
                       info: dict) -> tuple[State, Any]:
        """The model as it leaves the device, after training and the local privacy stage: user-level
        DP's clipping and share of the noise where the clients add it (dpfedavg noise: client), with
        its privacy release (node/accounting.Release) or None. `task_body`: what configure_round
        sent. By default: unchanged, no release."""
        return new_state, None

    def client_state(self) -> dict[str, Any]:
        """A client's own state before its first round (per client, kept across rounds and in checkpoints)."""
        return {}

    def client_on_task(self, client, task) -> Any:
        """A task reached `client` (node.client.ClientActor). None: it trains at once. Else the
        Reaction (node.actor) of a client half that talks to the server first (a task that waits
        for an answer stays in client.pending, which is checkpointed, until client_on_message
        trains it with client.train(task, message, SessionPlan))."""
        return None

    def client_on_message(self, client, msg) -> Any:
        """A server message of one of client_message_kinds reached `client`: its Reaction, or None."""
        return None

    # ---- extra arrays beside the model --------------------------------------------------------
    def extras_spec(self, model_spec: dict[str, tuple[tuple[int, ...], str]], direction: str
                    ) -> dict[str, tuple[tuple[int, ...], str]]:
        """The names and shapes of the arrays sent beside the model: "down" with a task, "up" with
        an update. A receiver refuses anything else."""
        return {}

    def round_extras(self, global_state: State) -> State:
        """Server: the arrays every task of this round carries beside the model (extras_spec "down")."""
        return {}

    @classmethod
    def secure_sum_why(cls, options: Options) -> str | None:
        """Why these options cannot take the cohort's sum from secure aggregation (None: they can)."""
        if cls.capabilities.secure_aggregation:
            return None
        return (f"{cls.name} needs each client's update at the server (the cohort's sum suits fedavg, fedprox, "
                f"fedavgm, fedadam, fedyogi, fedadagrad, scaffold, or dpfedavg with noise: client)")

    @classmethod
    def has_extras(cls) -> bool:
        """Whether it sends arrays beside the model (it overrides extras_spec)."""
        return cls.extras_spec is not Strategy.extras_spec

    # ---- checkpoints ----------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.STATE}

    def restore(self, state: Mapping[str, Any]) -> None:
        for name in self.STATE:
            setattr(self, name, state[name])


class StrategyError(ValueError):
    """An unknown strategy name or invalid options; str() names the key."""


STRATEGIES = Registry("strategy", Strategy, StrategyError)
REGISTRY: dict[str, type[Strategy]] = STRATEGIES.classes
register = STRATEGIES.register  # class decorator: make a Strategy available as `algorithm.name: NAME`
strategy_class = STRATEGIES.get  # a registered strategy by name, or a user's subclass by "package.module:Class"

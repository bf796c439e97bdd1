"""Selection policies as plug-ins: who among the clients the server may ask takes part.

A Selector sees the pool (client name -> the status it checked in with; empty without check-in)
and answers three questions: who is eligible at all, which k of the pool to ask this round, and
(after a round) what it learnt from an update. It owns its options and declares what it needs of
the server driving it; the server actors (node/server.py, node/async_server.py, node/flower/)
never branch on its name. `selection.policy` in a scenario names a registered one or a user's
subclass as "package.module:Class" (its options are then `selection.options`)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Mapping

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from .oort import OortParams, OortSelector
from .plugins import Registry
from .strategy import eligible, expected_seconds, select_clients, select_random, shortfall

Pool = Mapping[str, Mapping[str, Any]]


class SelectorOptions(BaseModel):
    """A selector's own options; unknown keys are errors."""
    model_config = ConfigDict(extra="forbid")


@dataclass(frozen=True)
class SelectionContext:
    """What a selection may use besides the pool: the round (or dispatch) it is for, the seeded
    generator to draw with, and what a client's round costs (for policies that rank by speed)."""
    round: int
    rng: np.random.Generator
    epochs: int = 1
    model_bytes: int = 0


class Selector:
    name: ClassVar[str] = ""
    Options: ClassVar[type[SelectorOptions]] = SelectorOptions
    STATE: ClassVar[tuple[str, ...]] = ()  # attributes that outlive a round (checkpointed)
    rounds_only: ClassVar[bool] = False  # True: it scores the clients of synchronous rounds (not for FedBuff)
    filters_only: ClassVar[bool] = False  # True: it only says who is eligible (a Flower strategy samples itself)
    # what it selects on that a client's private data determine, unnoised (a DP mechanism does not cover it); "" none
    private_statistics: ClassVar[str] = ""
    # the fields of a client's training statistics every update must carry to the server for it
    update_statistics: ClassVar[tuple[str, ...]] = ()
    # True: every client of the pool is equally likely to be picked, what a user-level DP accountant's
    # sampling amplification assumes; any other policy voids it (the ledger then says heuristic)
    uniform: ClassVar[bool] = False

    def __init__(self, options: SelectorOptions | Mapping[str, Any] | None = None):
        self.options = options if isinstance(options, self.Options) else self.Options.model_validate(dict(options or {}))

    def eligible(self, pool: Pool) -> list[str]:
        """The clients this policy may choose from, in name order."""
        return sorted(pool)

    def shortfall(self, pool: Pool) -> dict[str, int]:
        """How many clients of the pool fail each of its thresholds (for the no-eligible-clients report)."""
        return {}

    def select(self, pool: Pool, k: int, context: SelectionContext) -> list[str]:
        """k clients of the pool (all where k >= its size), in name order."""
        raise NotImplementedError

    def feedback(self, client: str, round_: int, samples: int, loss_rms: float | None, duration: float) -> None:
        """An update arrived: `duration` seconds after its round began, from `samples` samples."""

    def snapshot(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.STATE}

    def restore(self, state: Mapping[str, Any]) -> None:
        for name in self.STATE:
            setattr(self, name, state[name])


SELECTION_POLICIES = Registry("selection policy", Selector)
SELECTORS: dict[str, type[Selector]] = SELECTION_POLICIES.classes
register_selector = SELECTION_POLICIES.register  # class decorator: make a Selector available as `selection.policy: NAME`
selector_class = SELECTION_POLICIES.get  # a registered selector, or a user's subclass by "package.module:Class"


@register_selector("random")
class Uniform(Selector):
    """Uniformly at random among the pool."""
    filters_only = True
    uniform = True

    def select(self, pool: Pool, k: int, context: SelectionContext) -> list[str]:
        return select_random(list(pool), k, context.rng)


@register_selector("resource_aware")
class ResourceAware(Selector):
    """Uniformly at random among the clients meeting battery, CPU-load and uplink thresholds."""
    filters_only = True

    class Options(SelectorOptions):
        min_battery: float = Field(0.0, ge=0, le=1, description="battery fraction (charging devices pass)")
        max_cpu_load: float = Field(1.0, ge=0, le=1)
        min_up_mbps: float = Field(0.0, ge=0)

    def eligible(self, pool: Pool) -> list[str]:
        return eligible("resource_aware", pool, **self.options.model_dump())

    def shortfall(self, pool: Pool) -> dict[str, int]:
        return shortfall(pool, **self.options.model_dump())

    def select(self, pool: Pool, k: int, context: SelectionContext) -> list[str]:
        return select_random(self.eligible(pool), k, context.rng)


@register_selector("fastest")
class Fastest(Selector):
    """The clients with the lowest expected round time, a share drawn at random among the rest."""

    class Options(SelectorOptions):
        explore: float = Field(0.1, ge=0, le=1, description="share of the selection drawn at random")

    def select(self, pool: Pool, k: int, context: SelectionContext) -> list[str]:
        return select_clients("fastest", pool, k, context.rng, explore=self.options.explore, epochs=context.epochs,
                              down_bytes=context.model_bytes, up_bytes=context.model_bytes)


@register_selector("oort")
class Oort(Selector):
    """Oort (Lai et al., OSDI 2021): node/oort.py's utility, staleness bonus, pacer and exploration."""
    private_statistics = "the clients' exact training-loss statistics (the RMS of per-sample losses)"
    update_statistics = ("loss_rms",)
    rounds_only = True
    STATE = ("oort",)

    class Options(SelectorOptions):
        """Oort's parameters; the defaults are the paper's and its released code's."""
        preferred_duration_s: float | None = Field(
            None, gt=0, description="T: clients slower than this are penalised; null: the median expected duration of the "
                                    "first checked-in pool (or of the first clients tried)")
        alpha: float = Field(2.0, ge=0, description="penalty exponent of (T / duration)")
        exploration: float = Field(0.9, ge=0, le=1, description="epsilon: share of slots for never-tried clients, at round 0")
        exploration_decay: float = Field(0.98, gt=0, le=1, description="epsilon is multiplied by this each round...")
        exploration_min: float = Field(0.3, ge=0, le=1, description="...down to this")
        cutoff: float = Field(0.95, gt=0, le=1, description="exploit among clients scoring at least this times the k-th best")
        staleness_bonus: float = Field(0.1, ge=0, description="c of the bonus sqrt(c ln R / L) for clients not picked lately")
        pacer_window: int = Field(20, ge=1, description="W: compare the utility of the last W rounds with the W before")
        pacer_delta_s: float | None = Field(None, gt=0, description="T grows by this when utility falls; null: T / 10")

    def __init__(self, options=None):
        super().__init__(options)
        self.oort = OortSelector(OortParams(**self.options.model_dump()))

    def select(self, pool: Pool, k: int, context: SelectionContext) -> list[str]:
        expected = {n: expected_seconds(st, context.epochs, context.model_bytes, context.model_bytes)
                    for n, st in pool.items() if st}
        return self.oort.select(pool, k, context.round, context.rng, expected)

    def feedback(self, client: str, round_: int, samples: int, loss_rms: float | None, duration: float) -> None:
        self.oort.feedback(client, round_, samples, loss_rms, duration)

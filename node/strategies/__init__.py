"""Strategies by name: `algorithm.name` in a scenario picks one, `algorithm.options` configures it.
A new strategy is a module here with a @register'ed class, imported below."""
from .base import REGISTRY, ClientUpdate, Options, RoundControl, Strategy, StrategyError, register, strategy_class
from . import fedavg, fedavgm, fedalign, fedbuff  # noqa: F401  (registration)

__all__ = ["REGISTRY", "ClientUpdate", "Options", "RoundControl", "Strategy", "StrategyError", "register", "strategy_class"]

"""Strategies by name: `algorithm.name` in a scenario picks one, `algorithm.options` configures it.
A new built-in strategy is a module here with a @register'ed class: every module of this package is
imported (and so registered) below, in name order. Your own can live in your own package instead
(algorithm.name: package.module:Class)."""
import importlib
import pkgutil

from .base import REGISTRY, ClientUpdate, Options, RoundControl, Strategy, StrategyError, register, strategy_class

for _module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    importlib.import_module(f"{__name__}.{_module}")

__all__ = ["REGISTRY", "ClientUpdate", "Options", "RoundControl", "Strategy", "StrategyError", "register", "strategy_class"]

"""The one place that decides whether compiled code runs.

setup.py builds five optional C modules (the codec kernels, the flow model's filling and rebalance,
DP training's norms and noise, the CNN's fused ReLU and pool, the start state of seeded
generators). Each has a Python, numpy or torch path that gives the same bytes and numbers, so a
module that is missing (no C compiler at install) only makes the run slower. Every user of compiled code asks `compiled(name)` for its module and
gets None where the Python path must run: the module is not built, or EMULATOR_PURE_PYTHON=1 asks
for the Python paths everywhere (to compare them, or to rule the compiled code out of a problem)."""
from __future__ import annotations

import importlib
import os
from types import ModuleType

PURE_PYTHON_VARIABLE = "EMULATOR_PURE_PYTHON"


def pure_python() -> bool:
    return os.environ.get(PURE_PYTHON_VARIABLE, "") not in ("", "0")


def compiled(name: str) -> ModuleType | None:
    """The compiled module `name` (such as "protocol._kernels"), or None: run the Python path."""
    if pure_python():
        return None
    try:
        return importlib.import_module(name)
    except ImportError:  # not built here
        return None

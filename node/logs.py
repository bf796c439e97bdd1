"""Logging: every process of a run logs to its stderr through the loggers of this project's
packages (`protocol`, `node`, `emulator`; a module logs as `logging.getLogger(__name__)`), each line
prefixed by its process ("[network]", "[server]", "[host0]", "[conductor]").

The level is the run's `--log-level` (debug, info, warning, error; warning by default, where only
what went wrong is said), handed to the processes a run starts as EMULATOR_LOG_LEVEL in their
environment (a host that joins from another machine takes its own --log-level). At info a run says
what it builds and starts and each round's course; at debug every message an actor gets or sends
and every delivery the network makes, with its emulated time."""
from __future__ import annotations

import logging
import os
import sys

LEVEL_VARIABLE = "EMULATOR_LOG_LEVEL"
LEVELS = ("debug", "info", "warning", "error")
PACKAGES = ("protocol", "node", "emulator")


class _ProcessPrefix(logging.Filter):
    def __init__(self, process: str):
        super().__init__()
        self.prefix = f"[{process}] "

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        record.prefixed = message if message.startswith("[") else self.prefix + message
        return True


def level_name(level: str | None = None) -> str:
    """The level in force: `level`, else EMULATOR_LOG_LEVEL, else warning. An unknown name is warning."""
    name = (level or os.environ.get(LEVEL_VARIABLE) or "warning").lower()
    return name if name in LEVELS else "warning"


def set_level(level: str) -> None:
    """This process and the ones it starts from now on log at `level`."""
    os.environ[LEVEL_VARIABLE] = level_name(level)


def configure(process: str, level: str | None = None) -> None:
    """Called once as a process starts (and again in a forked child, which inherits its parent's
    handlers): one stderr handler on each of the packages' loggers, this process's prefix."""
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(_ProcessPrefix(process))
    handler.setFormatter(logging.Formatter("%(prefixed)s"))
    numeric = getattr(logging, level_name(level).upper())
    for package in PACKAGES:
        logger = logging.getLogger(package)
        logger.handlers[:] = [handler]
        logger.setLevel(numeric)
        logger.propagate = False

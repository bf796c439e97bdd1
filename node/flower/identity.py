"""Who is who in a Flower run under the emulator, and what Flower's runtime would have set. No
flwr at import: the host processes import this before they know they run a Flower app."""
from __future__ import annotations

from typing import Any

RUN_ID, SUPERLINK_NODE_ID = 1, 1  # one run; 1 is the SuperLink's node id in Flower
NODE_ID_BASE = 1000  # client i is Flower node 1000 + i


def empty_run() -> Any:
    """Flower's Run record for `grid.run` (its module moved between releases; None where unknown)."""
    for module in ("flwr.supercore.run", "flwr.common.typing"):
        try:
            run_class = getattr(__import__(module, fromlist=["Run"]), "Run")
            return run_class.create_empty(RUN_ID)
        except (ImportError, AttributeError, TypeError):
            continue
    return None


def set_task_identity(node_id: int) -> None:
    """What Flower's runtime sets before it runs an app: Message() reads it for new messages. (In
    flwr.supercore since 1.2x; older releases have no such thing to set.)"""
    try:
        from flwr.supercore.task_identity import TaskIdentity  # noqa: PLC0415
    except ImportError:
        return
    TaskIdentity.task_id = 1
    TaskIdentity.run_id = RUN_ID
    TaskIdentity.node_id = node_id

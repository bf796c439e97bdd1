"""The records the flow model and the congestion control share: a flow (links.Flow), a tcp flow's
window state (transport.TcpState) and a connection (transport.Connection).

Where the compiled rebalance is built (emulator/flows/_flowfill.c), it owns their layout: its
FlowRecord, WindowRecord and ConnectionRecord are C structs, each field a double or an object, that
Python reads and writes as attributes and the rebalance reads and writes in place. Otherwise they
are plain classes with the same fields as __slots__. Either way the Python classes subclass them
and add no fields; `Record` gives them pickling (the network's checkpoints hold connections) and a
repr."""
from __future__ import annotations

from typing import Any

from protocol.native import compiled

# the order is the C structs' (tests/test_links.py checks that they agree)
FLOW_FIELDS: tuple[str, ...] = ("path", "remaining_bits", "rate", "version", "done_at", "tcp", "active", "share",
                                "bottleneck", "link_bottleneck", "synced_t")
WINDOW_FIELDS: tuple[str, ...] = ("conn", "rtt_base", "seg_bits", "mss", "loss", "rng", "phase", "round_end", "budget",
                                  "loss_in", "recovery_until", "floor", "limited", "resent_bits", "pacing", "queues",
                                  "fid", "path", "window_key", "window_path", "wakeup")
CONNECTION_FIELDS: tuple[str, ...] = ("cwnd", "ssthresh", "srtt", "rtts", "last_send", "sending_since", "active",
                                      "waiting", "cc", "control")

# the compiled module (these records, the filling and the rebalance), or None; links.py uses it from here
native = compiled("emulator.flows._flowfill")


def _python_record(name: str, fields: tuple[str, ...]) -> type:
    return type(name, (), {"__slots__": fields, "__doc__": f"{name}: {', '.join(fields)} (the Python layout)."})


if native is not None:
    FlowRecord, WindowRecord, ConnectionRecord = native.FlowRecord, native.WindowRecord, native.ConnectionRecord
else:
    FlowRecord = _python_record("FlowRecord", FLOW_FIELDS)
    WindowRecord = _python_record("WindowRecord", WINDOW_FIELDS)
    ConnectionRecord = _python_record("ConnectionRecord", CONNECTION_FIELDS)


class Record:
    """A mix-in for the Python classes of the records: pickled and shown by their fields."""

    __slots__ = ()
    FIELDS: tuple[str, ...] = ()

    def __getstate__(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.FIELDS}

    def __setstate__(self, state: dict[str, Any]) -> None:
        for name, value in state.items():
            setattr(self, name, value)

    def __repr__(self) -> str:
        shown = ", ".join(f"{name}={getattr(self, name, None)!r}" for name in self.FIELDS if name not in ("queues", "rng"))
        return f"{type(self).__name__}({shown})"

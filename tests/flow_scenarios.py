"""Random flow-model workloads for tests/test_links_lazy.py: stars of access links behind a server
link, some behind a shared cell, with TCP windows, loss, queues and reused connections."""
from __future__ import annotations

import numpy as np

from emulator.flows.links import FlowModel
from emulator.flows.transport import TcpParams, TcpTransport


def workload(seed: int, tcp: bool, controls: tuple[str, ...] = ()) -> tuple[FlowModel, list[dict]]:
    """Random flows through stars; with `controls`, each connection's sender runs one of them."""
    rng = np.random.default_rng(seed)
    flows = int(rng.integers(3, 40))
    caps = {"server": float(rng.uniform(5e6, 200e6)), "cell": float(rng.uniform(2e6, 30e6))}
    queues = {"server": float(rng.uniform(0, 0.2)), "cell": float(rng.uniform(0, 0.5))}
    transfers = []
    for i in range(flows):
        access = f"a{i % max(2, flows // 2)}"  # some clients send twice: a reused connection
        caps[access] = float(rng.uniform(1e6, 100e6))
        queues[access] = float(rng.uniform(0, 0.3))
        path = (access, "cell", "server") if rng.random() < 0.3 else (access, "server")
        if rng.random() < 0.5:
            path = tuple(reversed(path))
        tr = {"bits": float(rng.uniform(8e3, 2e7)), "path": path, "latency": float(rng.uniform(0, 0.05))}
        if i > 0 and rng.random() < 0.2:
            tr.update(after=int(rng.integers(0, i)), gap=float(rng.uniform(0, 0.5)))
        else:
            tr["start"] = float(rng.uniform(0, 2.0))
        if tcp:
            tr.update(connection=(access, path[0] == "server"), rtt=2 * tr["latency"],
                      loss=float(rng.choice([0.0, 0.0, 0.005, 0.02])), rng=np.random.default_rng([seed, i]))
            if controls:
                tr["control"] = controls[int(rng.integers(len(controls)))]  # (a reused connection keeps its first)
        transfers.append(tr)
    model = FlowModel(caps, TcpTransport(TcpParams()) if tcp else None, queues)
    return model, transfers

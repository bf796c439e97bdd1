"""ServerApps for tests/test_flower.py. `app` is the quickstart example's own ServerApp with
Flower's FedAvg recording round 1's replies and its aggregate (to $FLOWER_PROBE_OUT), so that a
test can check the aggregate against a hand-computed weighted average of what the clients sent.
`broken` raises."""
import os

import numpy as np
from flwr.app import Context
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

import flower_quickstart.server_app as example


class RecordingFedAvg(FedAvg):
    def aggregate_train(self, server_round, replies):
        replies = list(replies)
        arrays, metrics = super().aggregate_train(server_round, replies)
        if server_round == 1:
            saved = {"nodes": np.array([r.metadata.src_node_id for r in replies]),
                     "examples": np.array([r.content["metrics"]["num-examples"] for r in replies])}
            for k, r in enumerate(replies):
                for name, value in r.content["arrays"].items():
                    saved[f"reply{k}/{name}"] = value.numpy()
            for name, value in arrays.items():
                saved[f"aggregate/{name}"] = value.numpy()
            np.savez(os.environ["FLOWER_PROBE_OUT"], **saved)
        return arrays, metrics


example.FedAvg = RecordingFedAvg  # the example's main, unchanged, now builds the recording strategy
app = example.app

broken = ServerApp()


@broken.main()
def crash(grid: Grid, context: Context) -> None:
    assert grid.run.run_id == context.run_id == 1 and len(list(grid.get_node_ids())) == 10
    raise RuntimeError("the app's own bug")

"""The ServerApp: FedAvg from Flower's own strategies."""
from flwr.app import ArrayRecord, ConfigRecord, Context
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from .task import Net

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    cfg = context.run_config
    nodes = int(cfg["min-nodes"])
    strategy = FedAvg(fraction_train=float(cfg["fraction-train"]), fraction_evaluate=float(cfg["fraction-evaluate"]),
                      min_train_nodes=nodes, min_evaluate_nodes=nodes, min_available_nodes=nodes)
    strategy.start(grid=grid, initial_arrays=ArrayRecord(Net().state_dict()), num_rounds=int(cfg["num-server-rounds"]),
                   train_config=ConfigRecord({"lr": float(cfg["lr"])}))

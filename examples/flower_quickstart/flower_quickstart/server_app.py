"""The ServerApp: Flower's own strategies, FedAvg by default (run_config strategy: fedavg, fedprox,
fedadam, or dp-fixed with the client_app:app_dp ClientApp and its clipping mod)."""
from flwr.app import ArrayRecord, ConfigRecord, Context
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import DifferentialPrivacyClientSideFixedClipping, FedAdam, FedAvg, FedProx

from .task import Net

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    cfg = context.run_config
    nodes = int(cfg["min-nodes"])
    common = dict(fraction_train=float(cfg["fraction-train"]), fraction_evaluate=float(cfg["fraction-evaluate"]),
                  min_train_nodes=nodes, min_evaluate_nodes=nodes, min_available_nodes=nodes)
    name = str(cfg.get("strategy", "fedavg"))
    if name == "fedprox":
        strategy = FedProx(**common, proximal_mu=float(cfg["proximal-mu"]))
    elif name == "fedadam":
        strategy = FedAdam(**common, eta=float(cfg["eta"]), eta_l=float(cfg["lr"]))
    elif name == "dp-fixed":  # needs the client_app_dp ClientApp (Flower's fixedclipping_mod)
        sampled = max(nodes, round(float(cfg["fraction-train"]) * len(list(grid.get_node_ids()))))
        strategy = DifferentialPrivacyClientSideFixedClipping(FedAvg(**common), float(cfg["noise-multiplier"]),
                                                              float(cfg["clipping-norm"]), sampled)
    else:
        strategy = FedAvg(**common)
    strategy.start(grid=grid, initial_arrays=ArrayRecord(Net().state_dict()), num_rounds=int(cfg["num-server-rounds"]),
                   train_config=ConfigRecord({"lr": float(cfg["lr"])}))

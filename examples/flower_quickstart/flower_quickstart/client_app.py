"""The ClientApp: train and evaluate the model it is sent on its own partition."""
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.clientapp.mod import fixedclipping_mod

from .task import Net, load_data, test as test_fn, train as train_fn

app = ClientApp()
# the same ClientApp with Flower's client-side DP clipping mod on its train messages (the mod refuses
# messages that carry no clipping norm, as evaluation's do), for DifferentialPrivacyClientSideFixedClipping
app_dp = ClientApp()


def _data(context: Context):
    cfg = context.run_config
    return load_data(int(context.node_config["partition-id"]), int(context.node_config["num-partitions"]),
                     int(cfg["batch-size"]), int(cfg["max-examples"]), str(cfg["data-root"]))


@app.train()
def train(msg: Message, context: Context) -> Message:
    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    trainloader, _ = _data(context)
    config = msg.content["config"]
    loss = train_fn(model, trainloader, int(context.run_config["local-epochs"]), float(config["lr"]),
                    float(config.get("proximal-mu", 0.0)))  # FedProx sends its mu in the config
    metrics = MetricRecord({"train_loss": loss, "num-examples": len(trainloader.dataset)})
    return Message(content=RecordDict({"arrays": ArrayRecord(model.state_dict()), "metrics": metrics}), reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    _, testloader = _data(context)
    loss, accuracy = test_fn(model, testloader)
    metrics = MetricRecord({"eval_loss": loss, "eval_acc": accuracy, "num-examples": len(testloader.dataset)})
    return Message(content=RecordDict({"metrics": metrics}), reply_to=msg)


app_dp.train(mods=[fixedclipping_mod])(train)
app_dp.evaluate()(evaluate)

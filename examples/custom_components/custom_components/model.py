"""A model factory: called as factory(**task.model_options), it returns a torch.nn.Module."""
from torch import nn


def small_mlp(inputs: int = 784, hidden: int = 32, classes: int = 10) -> nn.Module:
    """inputs -> hidden -> classes with a ReLU: inputs*hidden + hidden + hidden*classes + classes parameters."""
    return nn.Sequential(nn.Flatten(), nn.Linear(inputs, hidden), nn.ReLU(), nn.Linear(hidden, classes))

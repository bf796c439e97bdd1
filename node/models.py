"""Models named by scenarios: the built-in ones by name, a user's by the import path of its factory."""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from .layers import conv2d, hooked, relu_max_pool
from .plugins import PluginError, is_import_path, resolve_callable


class MnistCNN(nn.Module):
    """CNN_OriginalFedAvg (docs/algorithms.md 1.7): 1,663,370 parameters for 1x28x28 inputs."""

    def __init__(self, in_channels: int = 1, classes: int = 10, side: int = 28):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        )
        flat = 64 * (side // 4) * (side // 4)
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(flat, 512), nn.ReLU(), nn.Linear(512, classes))

    def forward(self, x):
        # the layers of self.features, with ReLU and pool fused and the first convolution's own
        # backward pass on the CPU (node/layers.py): the same results, a fifth less time a step
        f = self.features
        if hooked(f):
            return self.classifier(f(x))
        x = relu_max_pool(conv2d(x, f[0]), f[2])
        return self.classifier(relu_max_pool(f[3](x), f[5]))


class MLP(nn.Module):
    """A small multilayer perceptron for fast tests and network-only studies."""

    def __init__(self, in_features: int, classes: int = 10, hidden: int = 64):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(in_features, hidden), nn.ReLU(), nn.Linear(hidden, classes))

    def forward(self, x):
        return self.net(x)


class VGG7(nn.Module):
    """VGG7(bn=True) of docs/algorithms.md 1.7: 4 conv + 3 FC, 325,002 trainable parameters for 3x32x32."""

    def __init__(self, in_channels: int = 3, classes: int = 10):
        super().__init__()

        def block(cin, cout, pool):
            layers = [nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU()]
            return layers + ([nn.MaxPool2d(2)] if pool else [])

        self.features = nn.Sequential(
            *block(in_channels, 32, True), *block(32, 64, True), *block(64, 128, False), *block(128, 128, True),
            nn.AdaptiveAvgPool2d(2),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(), nn.Linear(512, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, classes),
        )

    def forward(self, x):
        return self.classifier(self.features(x))


class FirmaMLP(nn.Module):
    """The FIRMA model of docs/algorithms.md 2.1: a shared extractor (784-256-256-128 with LayerNorm)
    and a private linear head. Inputs in [0, 1] are normalised with (0.5, 0.5) inside, as the
    paper's loaders do."""

    def __init__(self, in_features: int, classes: int = 10):
        super().__init__()
        self.extractor = nn.Sequential(
            nn.Flatten(), nn.Linear(in_features, 256), nn.LayerNorm(256), nn.ReLU(),
            nn.Linear(256, 256), nn.LayerNorm(256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(),
        )
        self.head = nn.Linear(128, classes)

    def forward(self, x):
        return self.head(self.extractor((x - 0.5) / 0.5))


class CharLSTM(nn.Module):
    """LEAF's Shakespeare model: 8-dimensional character embedding, two LSTM layers of 256, a linear
    layer to the next character (leaf/models/shakespeare/stacked_lstm.py)."""

    COHORT = False  # torch has no vmap rule for its fused LSTM kernel: a cohort would loop client by client

    def __init__(self, vocabulary: int, classes: int):
        super().__init__()
        self.embed = nn.Embedding(vocabulary, 8)
        self.lstm = nn.LSTM(8, 256, num_layers=2, batch_first=True)
        self.out = nn.Linear(256, classes)

    def forward(self, x):
        hidden, _ = self.lstm(self.embed(x))
        return self.out(hidden[:, -1])


MODELS = ("mnist_cnn", "mlp", "vgg7", "firma_mlp", "char_lstm")
# Parameters that never leave a client in the ring algorithms, by name prefix.
PRIVATE_PREFIX = {"firma_mlp": "head."}
# Models without per-sample gradients (what DP-SGD clips), and why.
NO_PER_SAMPLE_GRADIENTS = {"vgg7": "BatchNorm, which mixes the samples of a batch",
                           "char_lstm": "an LSTM, which has no vectorised per-sample rule"}


def build_model(name: str, input_shape: tuple[int, ...], classes: int, seed: int = 0,
                options: dict | None = None) -> nn.Module:
    """A model by its registered name, or a user's factory named "package.module:factory" and
    called as factory(**options) (the seed fixes its initialization as it does the built-in ones')."""
    torch.manual_seed(seed)
    if is_import_path(name):
        return user_model(name, options or {})
    if name == "mnist_cnn":
        if len(input_shape) != 3 or input_shape[1] != input_shape[2]:
            raise ValueError(f"mnist_cnn needs square C x H x W inputs, got {input_shape}")
        return MnistCNN(input_shape[0], classes, input_shape[1])
    if name == "mlp":
        return MLP(int(np.prod(input_shape)), classes)
    if name == "firma_mlp":
        return FirmaMLP(int(np.prod(input_shape)), classes)
    if name == "vgg7":
        if len(input_shape) != 3:
            raise ValueError(f"vgg7 needs C x H x W inputs, got {input_shape}")
        return VGG7(input_shape[0], classes)
    if name == "char_lstm":
        if len(input_shape) != 1:
            raise ValueError(f"char_lstm needs sequences of character indices, got inputs of shape {input_shape}")
        return CharLSTM(classes, classes)
    raise ValueError(f"unknown model {name!r}; known: {', '.join(MODELS)}")


def user_model(path: str, options: dict) -> nn.Module:
    """factory(**options) for the factory at `path`; PluginError names what went wrong."""
    factory = resolve_callable(path)
    try:
        model = factory(**options)
    except Exception as exc:  # the user's code: whatever it raises is reported in one line
        raise PluginError(f"{path!r}: {path.partition(':')[2]}(**model_options) raised {type(exc).__name__}: {exc}") from None
    if not isinstance(model, nn.Module):
        raise PluginError(f"{path!r} returned a {type(model).__name__}, not a torch.nn.Module")
    return model


def state_to_numpy(model: nn.Module) -> dict[str, np.ndarray]:
    """A copy of the model's state. Never a view: the arrays may be sent without copying while the
    same model trains the next client."""
    return {k: v.detach().cpu().numpy().copy() for k, v in model.state_dict().items()}


def load_numpy_state(model: nn.Module, state: dict[str, np.ndarray]) -> None:
    own = model.state_dict()
    model.load_state_dict({k: torch.as_tensor(np.asarray(state[k])).to(own[k].dtype) for k in own})


def state_spec(model: nn.Module) -> dict[str, tuple[tuple[int, ...], str]]:
    """What a decoded state must look like: name -> (shape, wire dtype)."""
    return {
        k: (tuple(v.shape), "f4" if v.is_floating_point() else "i8") for k, v in model.state_dict().items()
    }


def training_flops(model: nn.Module, input_shape: tuple[int, ...], trained: str | None = None) -> float:
    """FLOPs of one training sample: 2 per multiply-accumulate of the convolutions and linear layers
    in the forward pass, and 4 more in the backward pass (the usual 3x estimate; activations,
    normalisation and pooling are left out). The MNIST CNN comes to 73.6 MFLOP. With `trained`,
    only the layers whose names start with it are trained: the others (frozen, and before them in
    the network) have no backward pass."""
    macs = total_macs = 0

    def count(name):
        def hook(module, inputs, output):
            nonlocal macs, total_macs
            if isinstance(module, nn.Conv2d):
                kernel = module.in_channels // module.groups * module.kernel_size[0] * module.kernel_size[1]
                n = output[0].numel() * kernel
            elif isinstance(module, nn.LSTM):  # four gates per layer per step, on the input and the state
                size = module.hidden_size
                n = inputs[0].shape[1] * sum(4 * size * ((module.input_size if i == 0 else size) + size)
                                             for i in range(module.num_layers))
            else:
                n = module.in_features * module.out_features
            total_macs += n
            if trained is None or f"{name}.".startswith(trained):
                macs += n
        return hook

    counted = (nn.Conv2d, nn.Linear, nn.LSTM)
    hooks = [m.register_forward_hook(count(name)) for name, m in model.named_modules() if isinstance(m, counted)]
    tokens = any(isinstance(m, nn.Embedding) for m in model.modules())
    try:
        with torch.no_grad():
            model.eval()
            model(torch.zeros((1, *input_shape), dtype=torch.long if tokens else torch.float32))
    finally:
        for h in hooks:
            h.remove()
    return 2.0 * total_macs + 4.0 * macs


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)

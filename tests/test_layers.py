"""node/layers.py: ReLU and a 2x2 max-pool in one compiled pass, and the single-input-channel
convolution's native backward pass, against torch's own layers."""
import pytest
import torch
from torch import nn
from torch.func import functional_call, grad, vmap
from torch.nn import functional as F

from node import layers
from node.models import MnistCNN


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().view(torch.int32)


def _awkward(shape, seed: int) -> torch.Tensor:
    """Random activations with what a max and a ReLU must get right: ties, zeros of both signs, NaN."""
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(seed))
    flat = x.view(-1)
    flat[::7] = 0.0
    flat[::11] = -0.0
    flat[::13] = 1.5
    flat[::101] = float("nan")
    return x


@pytest.mark.skipif(layers._layerkernels is None, reason="node._layerkernels is not built")
@pytest.mark.parametrize("shape", [(10, 32, 28, 28), (4, 64, 14, 14), (3, 5, 7, 9), (2, 3, 12, 10), (1, 1, 2, 2), (2, 2, 5, 3)])
def test_relu_max_pool_is_torch_bit_for_bit(shape):
    pool = nn.MaxPool2d(2)
    x = _awkward(shape, seed=sum(shape))
    fused, plain = x.clone().requires_grad_(), x.clone().requires_grad_()
    out = layers.relu_max_pool(fused, pool)
    expected = pool(F.relu(plain))
    assert out.grad_fn is not None and type(out.grad_fn).__name__.startswith("_ReluMaxPool2")  # the kernel ran
    assert torch.equal(_bits(out), _bits(expected))
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    grad_out.view(-1)[::5] = -0.0
    out.backward(grad_out)
    expected.backward(grad_out)
    assert torch.equal(_bits(fused.grad), _bits(plain.grad))


def test_relu_max_pool_falls_back_where_the_kernel_does_not_apply(monkeypatch):
    x = torch.randn(2, 3, 8, 8)
    for pool in (nn.MaxPool2d(3), nn.MaxPool2d(2, stride=1), nn.MaxPool2d(2, ceil_mode=True)):
        assert torch.equal(layers.relu_max_pool(x, pool), pool(F.relu(x)))
    assert layers.relu_max_pool(x.double(), nn.MaxPool2d(2)).dtype == torch.float64
    monkeypatch.setattr(layers, "_layerkernels", None)
    out = layers.relu_max_pool(x.requires_grad_(), nn.MaxPool2d(2))
    assert type(out.grad_fn).__name__ == "MaxPool2DWithIndicesBackward0"


def test_single_channel_convolution_gradients_match_torch():
    conv = nn.Conv2d(1, 32, 5, padding=2)
    x = torch.rand(10, 1, 28, 28, generator=torch.Generator().manual_seed(2)).requires_grad_()
    grad_out = torch.randn(10, 32, 28, 28, generator=torch.Generator().manual_seed(3))
    out = layers.conv2d(x, conv)
    assert type(out.grad_fn).__name__.startswith("_SingleChannelConv2d")
    assert torch.equal(out, conv(x))  # the forward pass is torch's own
    out.backward(grad_out)
    mine = (x.grad.clone(), conv.weight.grad.clone(), conv.bias.grad.clone())
    x.grad = conv.weight.grad = conv.bias.grad = None
    conv(x).backward(grad_out)
    for a, b in zip(mine, (x.grad, conv.weight.grad, conv.bias.grad)):
        # the same sums in another order: float32 rounding, relative to the gradient's scale
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5 * float(b.abs().max()))
    several = nn.Conv2d(3, 8, 3, padding=1)  # oneDNN's backward pass is the faster one there
    assert type(layers.conv2d(torch.rand(2, 3, 6, 6), several).grad_fn).__name__ == "ConvolutionBackward0"


def test_cnn_calls_hooked_layers_one_by_one():
    """Opacus computes per-sample gradients from hooks on each Conv2d: a hooked model must run
    its layers as written, and give the same outputs either way."""
    model = MnistCNN()
    x = torch.rand(4, 1, 28, 28)
    fused = model(x)
    seen = []
    handle = model.features[0].register_forward_hook(lambda m, i, o: seen.append(o.shape))
    hooked = model(x)
    handle.remove()
    assert seen == [torch.Size([4, 32, 28, 28])]
    assert torch.equal(fused, hooked)


def test_cnn_under_vmap_takes_torch_layers():
    """Cohort training vmaps the model over per-client weights: the compiled paths step aside."""
    model = MnistCNN()
    params = {k: v.detach() for k, v in model.named_parameters()}
    stacked = {k: torch.stack([v, v * 0.5]) for k, v in params.items()}
    x = torch.rand(2, 3, 1, 28, 28)
    y = torch.randint(0, 10, (2, 3))

    def loss(p, xb, yb):
        return F.cross_entropy(functional_call(model, p, (xb,)), yb)

    batched = vmap(grad(loss))(stacked, x, y)
    for c in range(2):
        one = grad(loss)({k: v[c] for k, v in stacked.items()}, x[c], y[c])
        for k in one:
            torch.testing.assert_close(batched[k][c], one[k], rtol=1e-4, atol=1e-6)


def test_torch_layers_turns_the_compiled_paths_off_for_a_plain_baseline():
    model = MnistCNN()
    x = torch.rand(2, 1, 28, 28, requires_grad=True)
    with layers.torch_layers():
        plain = layers.relu_max_pool(x, nn.MaxPool2d(2))
        assert type(layers.conv2d(x, model.features[0]).grad_fn).__name__ == "ConvolutionBackward0"
    assert type(plain.grad_fn).__name__ == "MaxPool2DWithIndicesBackward0"
    assert type(layers.conv2d(x, model.features[0]).grad_fn).__name__.startswith("_SingleChannelConv2d")

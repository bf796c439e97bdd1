"""Faster CPU versions of two steps of the CNNs' training, with torch's results: ReLU followed
by a 2x2 max-pool in one compiled pass (node/_layerkernels.c), and the gradient of a convolution
with one input channel by torch's own im2col + GEMM kernel rather than oneDNN's.

Each is taken only where it applies (a plain float32 CPU tensor, outside torch.func's
transforms, which cohort training uses); everywhere else the layers run as torch writes them."""
from __future__ import annotations

import contextlib
from typing import Iterator

import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.modules import module as torch_module

from protocol.native import compiled

_layerkernels = compiled("node._layerkernels")  # without it: torch's ops, the same results

try:
    _wrapped = torch._C._functorch.is_functorch_wrapped_tensor
except AttributeError:  # a torch without it: assume any tensor may be one
    def _wrapped(t: torch.Tensor) -> bool:
        return True


_HOOKS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")


def hooked(module: nn.Module) -> bool:
    """Whether a hook watches the module or one inside it (or every module: a global hook). Such
    layers must be called one by one, as written: Opacus computes per-sample gradients from
    hooks on each Conv2d and Linear, and a user's probe expects to see each layer's output."""
    if any(getattr(torch_module, f"_global{name}", None) for name in _HOOKS):
        return True
    return any(getattr(sub, name, None) for sub in module.modules() for name in _HOOKS)


_enabled = True


@contextlib.contextmanager
def torch_layers() -> Iterator[None]:
    """Within it, the layers run as torch writes them (for a baseline of plain PyTorch)."""
    global _enabled
    before, _enabled = _enabled, False
    try:
        yield
    finally:
        _enabled = before


def _plain_cpu_float(t: torch.Tensor) -> bool:
    return _enabled and t.device.type == "cpu" and t.dtype == torch.float32 and not _wrapped(t)


class _ReluMaxPool2(torch.autograd.Function):
    """max_pool2d(relu(x), 2) on a contiguous NCHW float32 tensor; saves the pooled output and
    one byte per output for the backward pass (torch keeps relu's full output and int64 indices)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        n, c, h, w = x.shape
        out = x.new_empty((n, c, h // 2, w // 2))
        idx = torch.empty(out.shape, dtype=torch.uint8)
        _layerkernels.relu_maxpool2_forward(x.numpy(), out.numpy(), idx.numpy(), n * c, h, w)
        ctx.save_for_backward(out, idx)
        ctx.input_shape = (n, c, h, w)
        return out

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor) -> torch.Tensor:
        out, idx = ctx.saved_tensors
        n, c, h, w = ctx.input_shape
        grad_in = grad_out.new_empty((n, c, h, w))
        _layerkernels.relu_maxpool2_backward(grad_out.contiguous().numpy(), out.numpy(), idx.numpy(), grad_in.numpy(),
                                             n * c, h, w)
        return grad_in


def relu_max_pool(x: torch.Tensor, pool: nn.MaxPool2d) -> torch.Tensor:
    """pool(relu(x)), in one compiled pass where that applies (a 2x2, stride-2 pool without
    padding or dilation, of a 4-dimensional float32 CPU tensor)."""
    plain_2x2 = (pool.kernel_size in (2, (2, 2)) and pool.stride in (2, (2, 2)) and pool.padding in (0, (0, 0))
                 and pool.dilation in (1, (1, 1)) and not pool.ceil_mode and not pool.return_indices)
    if _layerkernels is not None and plain_2x2 and x.dim() == 4 and _plain_cpu_float(x) and min(x.shape[2:]) >= 2:
        return _ReluMaxPool2.apply(x)
    return pool(F.relu(x))


class _SingleChannelConv2d(torch.autograd.Function):
    """A stride-1 convolution whose gradients come from torch's native kernel (im2col + GEMM):
    with one input channel, oneDNN's backward pass takes about four times as long on the CPU."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, padding: list[int]):
        ctx.save_for_backward(x, weight)
        ctx.padding = padding
        ctx.has_bias = bias is not None
        return F.conv2d(x, weight, bias, padding=padding)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        x, weight = ctx.saved_tensors
        wants = [ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.needs_input_grad[2] and ctx.has_bias]
        grad_x, grad_w, grad_b = torch.ops.aten._slow_conv2d_backward.output_mask(
            grad_out.contiguous(), x, weight, list(weight.shape[2:]), [1, 1], ctx.padding, wants)
        return grad_x, grad_w, grad_b, None


def conv2d(x: torch.Tensor, conv: nn.Conv2d) -> torch.Tensor:
    """conv(x), with the native backward pass where oneDNN's is slow: one input channel, stride 1,
    no dilation or groups, zero padding given as numbers, on the CPU."""
    simple = (conv.in_channels == 1 and conv.stride == (1, 1) and conv.dilation == (1, 1) and conv.groups == 1
              and conv.padding_mode == "zeros" and not isinstance(conv.padding, str))
    if simple and x.dim() == 4 and _plain_cpu_float(x) and _plain_cpu_float(conv.weight):
        return _SingleChannelConv2d.apply(x.contiguous(), conv.weight, conv.bias, list(conv.padding))
    return conv(x)

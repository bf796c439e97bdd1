"""Where a host process trains: `task.device` (auto | cpu | cuda | cuda:N) resolved inside the
host, after the fork, so the conductor never creates a CUDA context that its children would inherit.

Hosts are spread over the visible GPUs round-robin (host i on GPU i mod G); the hosts that share
a GPU each get an equal share of its memory unless `task.gpu_memory_fraction` says otherwise."""
from __future__ import annotations

import re
from dataclasses import dataclass

SPEC = re.compile(r"^(auto|cpu|cuda(:(\d+))?)$")
EXIT_DEVICE = 78  # EX_CONFIG: a host that cannot open the device it was given exits with this


class DeviceError(RuntimeError):
    """The requested training device cannot be used; the message is one line for the user."""


def check_spec(spec: str) -> str:
    if not isinstance(spec, str) or not SPEC.match(spec):
        raise ValueError("must be auto, cpu, cuda or cuda:N")
    return spec


@dataclass(frozen=True)
class DevicePlan:
    """What the scenario asks for, and how many hosts share the machine's GPUs."""

    spec: str = "cpu"
    hosts: int = 1
    memory_fraction: float | None = None  # of its GPU's memory, per host; None: an equal share


@dataclass(frozen=True)
class Placement:
    device: str  # "cpu" or "cuda:N"
    memory_fraction: float | None  # the cap on this host's share of the GPU (None on the CPU)
    reason: str  # why this device, in words (auto's fallback says why)


def place(plan: DevicePlan, host_index: int, gpus: int, cuda_problem: str | None = None) -> Placement:
    """Pure placement: the device of host `host_index` when `gpus` CUDA devices are visible
    (`cuda_problem`: why CUDA is unusable, when it is). Raises DeviceError for what cannot be met."""
    check_spec(plan.spec)
    if plan.spec == "cpu":
        return Placement("cpu", None, "task.device: cpu")
    if gpus <= 0:
        why = cuda_problem or "no CUDA device is visible"
        if plan.spec == "auto":
            return Placement("cpu", None, f"task.device auto: {why}; training on the CPU")
        raise DeviceError(f"task.device: {plan.spec} requested, but {why} "
                          f"(use task.device: auto to fall back to the CPU, or cpu)")
    match = SPEC.match(plan.spec)
    if match.group(3) is not None:
        index = int(match.group(3))
        if index >= gpus:
            raise DeviceError(f"task.device: {plan.spec} requested, but only {gpus} CUDA device(s) are visible (cuda:0..cuda:{gpus - 1})")
        sharing = plan.hosts
    else:
        index = host_index % gpus
        sharing = len(range(index, plan.hosts, gpus))
    fraction = plan.memory_fraction if plan.memory_fraction is not None else 1.0 / max(sharing, 1)
    return Placement(f"cuda:{index}", fraction, f"task.device {plan.spec}: host {host_index} of {plan.hosts} on GPU {index} "
                                                f"(shared by {sharing} host(s))")


def _one_line(exc: Exception) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"


def open_device(plan: DevicePlan, host_index: int) -> tuple[Placement, dict]:
    """Resolve and open this host's device (in the host process). Returns the placement and what
    to report about it; raises DeviceError with a one-line reason."""
    import torch

    if plan.spec == "cpu":
        return place(plan, host_index, 0), {"device": "cpu"}
    gpus, problem = 0, None
    try:
        if not torch.backends.cuda.is_built():
            problem = f"this torch ({torch.__version__}) was built without CUDA"
        elif torch.cuda.is_available():
            gpus = torch.cuda.device_count()
        else:
            problem = "no CUDA device is visible (torch.cuda.is_available() is False)"
    except Exception as exc:  # a broken driver raises many kinds of errors; the user needs one line
        problem = f"CUDA failed to initialise ({_one_line(exc)})"
    placement = place(plan, host_index, gpus, problem)
    if placement.device == "cpu":
        return placement, {"device": "cpu", "reason": placement.reason}
    try:
        dev = torch.device(placement.device)
        torch.cuda.set_device(dev)
        if placement.memory_fraction is not None:
            torch.cuda.set_per_process_memory_fraction(min(placement.memory_fraction, 1.0), dev)
        props = torch.cuda.get_device_properties(dev)
        torch.zeros(1, device=dev)  # create the context now, so a failure is reported here
    except Exception as exc:
        raise DeviceError(f"task.device: {placement.device} could not be opened ({_one_line(exc)})") from None
    return placement, {"device": placement.device, "name": props.name, "memory_gib": round(props.total_memory / 2**30, 2),
                       "memory_fraction": placement.memory_fraction, "reason": placement.reason}

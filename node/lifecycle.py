"""Process hygiene shared by every emulator process. No torch here: the network process imports
this and nothing heavy."""
from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import gc
import io
import os
import signal

from typing import Iterator

from . import logs

PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters
HEAP_BLOCK_MAX = 32 * 2**20  # blocks up to this size come from the heap, not from mmap
HEAP_KEEP = 128 * 2**20  # free memory at the top of the heap kept up to this size


def detach_from_terminal_signals(parent_pid: int, name: str) -> None:
    """Die with the parent, name the process (for ps and top), let the conductor alone decide
    about Ctrl-C, dump the threads' stacks on SIGUSR1 (as the CLI does) rather than die of it (the
    network process is a fresh interpreter, which inherits no handler), and log as itself."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        libc.prctl(PR_SET_NAME, f"flemu-{name}"[:15].encode())
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent_pid:
        os._exit(1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    dump_stacks_on_sigusr1()
    logs.configure(name)  # its own prefix, at the run's level (node/logs.py)


def dump_stacks_on_sigusr1() -> None:
    """kill -USR1 PID prints the process's threads' stacks to its stderr: where is it stuck?"""
    if hasattr(signal, "SIGUSR1"):
        try:
            faulthandler.register(signal.SIGUSR1, all_threads=True)
        except (io.UnsupportedOperation, ValueError, AttributeError):
            pass  # a stderr with no file descriptor (a notebook, an in-process runner): no stacks on demand


def keep_freed_memory() -> bool:
    """Keep model-sized blocks in the process's heap once freed. glibc's default hands free memory
    at the top of the heap back to the kernel as soon as it exceeds twice the largest block freed,
    so with the 6.6 MB tensors a training step of the CNN allocates and frees, the same pages
    were returned and faulted in again at every step: about 6,000 page faults and 15 % of a
    client's training time. Returns False where the C library has no mallopt (not glibc)."""
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    # Setting the trim threshold turns glibc's adaptive thresholds off, so both are set.
    return bool(mallopt(M_MMAP_THRESHOLD, HEAP_BLOCK_MAX)) and bool(mallopt(M_TRIM_THRESHOLD, HEAP_KEEP))


# The collector's thresholds in a process that settled its heap: allocations between young
# collections, young collections between middle ones, middle between full ones (Python's: 700, 10,
# 10). A round 0 of 100,000 devices in the network process found no cyclic garbage at all; at
# (100,000, 10, 10) its 27 young and 2 middle collections took 1.1 s, the middle ones most of it.
THRESHOLDS = (100_000, 50, 100)


@contextlib.contextmanager
def building() -> Iterator[None]:
    """No cyclic collection while a process builds what it will keep (reference counting still
    frees everything that is not a cycle); what was built is frozen out of later collections, and
    the collector is on afterwards, whatever it was before (the network's fresh interpreter starts
    with it off, to unpickle its configuration).

    A population's processes hold hundreds of thousands of long-lived objects (devices, actors).
    The collector is triggered by allocations and, at its defaults, walks them again and again
    while they are being made: 40 % of building a 100,000-device world, 80 % of unpickling its
    devices in the network process."""
    gc.disable()
    try:
        yield
    finally:
        settle_heap()
        gc.enable()


def settle_heap() -> None:
    """Keep every object alive now out of later collections (gc.freeze), and collect at THRESHOLDS:
    the network creates and drops a few objects per event, almost none in cycles, and at Python's
    thresholds collected every 700 allocations."""
    gc.freeze()
    gc.set_threshold(*THRESHOLDS)

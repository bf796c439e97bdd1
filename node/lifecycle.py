"""Process hygiene shared by every emulator process. No torch here: the network process imports
this and nothing heavy."""
from __future__ import annotations

import ctypes
import os
import signal

PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15


def detach_from_terminal_signals(parent_pid: int, name: str) -> None:
    """Die with the parent, name the process (for ps and top), and let the conductor alone decide
    about Ctrl-C."""
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

"""Child processes that do not outlive the process that started them."""

from __future__ import annotations

import ctypes
import signal

PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGTERM):
    """A Popen preexec_fn: the child gets `sig` when its parent dies, even by SIGKILL (Linux
    prctl PR_SET_PDEATHSIG)."""

    def preexec() -> None:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, int(sig))

    return preexec

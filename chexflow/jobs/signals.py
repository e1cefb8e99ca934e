"""SIGTERM while a job runs: a KFP run terminated or a pod deleted must delete the job first."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator


class Terminated(BaseException):
    """SIGTERM arrived (a BaseException, so no `except Exception` on the way swallows it)."""


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
    """While inside, SIGTERM raises Terminated in the main thread (once: SIGTERM is ignored
    while the job is being deleted); the previous handler is restored afterwards."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, _frame) -> None:
        ignore_sigterm()
        raise Terminated

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def ignore_sigterm() -> None:
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, signal.SIG_IGN)

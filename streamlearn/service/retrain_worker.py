"""The retraining worker beside the serving loop: a process with a CPU share, never waited for.

A retrain runs in a separate process by default (a thread would share the interpreter
lock with the loop, docs/performance.md). The process runs at a lower priority than
the loop — ``nice`` ``retrain.worker_nice`` (default 5: about a quarter of a core it
shares with the loop or anything else at the default priority) — and with one BLAS
thread, so when the machine is busy the loop gets the larger share of the CPU, yet the
worker still gets a share and every retrain finishes. Measured with the loop saturated
and a second process spinning on the other core (a retrain due every 8 s, logistic on
4,000 rows, 60 s): 1 retrain finished at nice 10, 5 at nice 5, 7 at nice 0, the loop's
rate the same within noise. Linux's ``SCHED_IDLE``, which the worker used before, gives
it *no* share while anything else wants the CPU: on a loaded two-core machine a retrain
then never ended.

:class:`RetrainWorker` starts the process in the background (its imports are the
first task; serving does not wait for them), submits jobs, reports a job that outlives
``retrain.timeout_seconds`` (the process is replaced) and replaces a process that died.
"""

from __future__ import annotations

import concurrent.futures as futures
import contextlib
import multiprocessing
import os
import time
from collections.abc import Callable
from typing import Any

__all__ = ["RetrainWorker"]


def _worker_init(nice: int) -> None:
    """A training process yields the CPU to the serving loop: a lower priority (``nice``) and
    one BLAS thread (at the BLAS default, p99 decision latency tripled on two cores)."""
    with contextlib.suppress(OSError, AttributeError):
        os.nice(nice)
    _die_with_parent()
    with contextlib.suppress(ImportError):
        from threadpoolctl import threadpool_limits

        threadpool_limits(limits=1)


def _die_with_parent() -> None:
    """Linux: the worker gets SIGKILL when the daemon dies, even by ``kill -9`` (a pool
    worker otherwise waits for work forever)."""
    with contextlib.suppress(OSError, AttributeError):
        import ctypes
        import signal

        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
        if os.getppid() == 1:  # the parent died before the call
            os._exit(1)


def _warm_up() -> None:
    """The first task of a new worker: it imports what a retrain needs."""
    import streamlearn.retrain.job  # noqa: F401


class RetrainWorker:
    """One job at a time in a worker process (or thread); see the module doc."""

    def __init__(self, kind: str = "process", nice: int = 5) -> None:
        self.kind, self.nice = kind, nice
        self._executor: futures.Executor | None = None
        self.job: futures.Future[dict[str, Any]] | None = None
        self.started = 0.0  # perf_counter when the job was submitted

    def start(self) -> None:
        """Start the worker now; its imports run while the loop serves."""
        self._pool().submit(_warm_up)

    def _pool(self) -> futures.Executor:
        if self._executor is None:
            self._executor = (futures.ProcessPoolExecutor(
                1, mp_context=multiprocessing.get_context("spawn"), initializer=_worker_init,
                initargs=(self.nice,))
                if self.kind == "process" else futures.ThreadPoolExecutor(
                    1, thread_name_prefix="streamlearn-retrain"))
        return self._executor

    def submit(self, fn: Callable[[dict[str, Any]], dict[str, Any]], spec: dict[str, Any]) -> None:
        self.job = self._pool().submit(fn, spec)
        self.started = time.perf_counter()

    @property
    def busy(self) -> bool:
        return self.job is not None and not self.job.done()

    @property
    def running_for(self) -> float:
        """Seconds since the current job was submitted (0 without one)."""
        return time.perf_counter() - self.started if self.job is not None else 0.0

    def take(self) -> futures.Future[dict[str, Any]] | None:
        """The finished job, if any (the worker is then free)."""
        if self.job is None or not self.job.done():
            return None
        job, self.job = self.job, None
        return job

    def restart(self) -> None:
        """Replace the worker (after a death or a timeout); the new one starts warming up."""
        self.stop()
        self.start()

    def stop(self) -> None:
        """Stop the worker without waiting for a job (its process is terminated)."""
        executor, self._executor = self._executor, None
        self.job = None
        if executor is None:
            return
        processes = list(getattr(executor, "_processes", {}).values())
        executor.shutdown(wait=False, cancel_futures=True)
        for process in processes:
            with contextlib.suppress(Exception):
                process.terminate()

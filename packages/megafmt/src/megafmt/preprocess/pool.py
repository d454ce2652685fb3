"""The preprocess worker pool: how its processes start, and what a run says when one dies.

Start method. ``fork`` starts workers at once and needs no ``__main__`` guard in a caller's
script (as with Megatron's tool), but a child forked beside other threads inherits their
half-done state (locks held, structures mid-change), and a library's at-fork handler or the
first garbage collection in the child can then crash it: a ``make test`` run lost a worker to a
segmentation fault exactly there, forked from a process that ran a Ray cluster. So workers are
forked only while the process has no more threads than it had when this module was imported
(numpy's BLAS pool, which handles fork) and Python started none, threads that earlier runs
which forked left behind aside (their tokenizers' pools); a process that has started threads
otherwise (Ray, torch, a gRPC client, its own) starts them from ``forkserver`` (a clean
single-threaded process; ``spawn`` where there is none). Such a caller's script needs the
``if __name__ == "__main__":`` guard, as every script that starts processes that way does.

A dead worker. ``concurrent.futures`` only says that "a process in the process pool was
terminated abruptly"; :class:`WorkerDiedError` says which worker ended, how (its exit status
or the signal that killed it, with what usually sends that signal) and which input it was
given.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
from concurrent.futures.process import BrokenProcessPool, ProcessPoolExecutor

from megafmt.errors import MegafmtError
from megafmt.termination import watcher_threads

#: what usually sends a signal that kills a worker, said beside its name
SIGNAL_CAUSES = {
    signal.SIGKILL: "the kernel's out-of-memory killer sends it (see `dmesg`), as does `kill -9`",
    signal.SIGSEGV: "a crash in native code (a tokenizer library, or a library's state "
    "inherited by a forked worker)",
    signal.SIGBUS: "an input or output file truncated while mapped, or a full /dev/shm",
    signal.SIGABRT: "a native library aborted",
    signal.SIGTERM: "someone stopped it (the pool stops the other workers after the first dies)",
}
#: the exit status of a worker whose initializer raised (concurrent.futures logs the traceback
#: on stderr and ends the worker normally)
INITIALIZER_FAILED = 0


class WorkerDiedError(MegafmtError, BrokenProcessPool):
    """A preprocess worker process ended while it had input to encode; the message names the
    worker, its exit status or signal, and the input. A ``BrokenProcessPool``, so callers that
    caught that keep working."""


#: threads whose library makes fork safe for them (it takes its locks around the fork and
#: restarts them in the child), not counted by :func:`threads_in_process`: jemalloc's background
#: thread, which importing pyarrow starts (a run imports it before its workers fork)
FORK_SAFE_THREADS = frozenset({"jemalloc_bg_thd"})


def threads_in_process() -> int:
    """The threads of this process, native ones included, those of :data:`FORK_SAFE_THREADS`
    and the SIGTERM watcher (:func:`megafmt.termination.watcher_threads`) aside (Linux reads
    ``/proc``; elsewhere only the threads Python started are seen)."""
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return _python_threads()
    return sum(_thread_name(task) not in FORK_SAFE_THREADS for task in tasks) - watcher_threads()


def _python_threads() -> int:
    """The threads Python started, the SIGTERM watcher aside."""
    return threading.active_count() - watcher_threads()


def _thread_name(task: str) -> str:
    """The name of this process's thread ``task`` ("" for one that ended meanwhile)."""
    try:
        with open(f"/proc/self/task/{task}/comm") as comm:
            return comm.read().strip()
    except OSError:
        return ""


#: the threads the process had when megafmt's preprocess was imported (numpy's BLAS pool)
THREADS_AT_IMPORT = threads_in_process()
#: the threads (all, and Python's) the process may hold and still fork its workers: those it
#: had at the import, and those that runs which forked left behind (their tokenizers' pools)
_forks_beside = {"all": THREADS_AT_IMPORT, "python": 1}


def worker_context() -> multiprocessing.context.BaseContext:
    """``fork`` while the process has started no thread since this module was imported but the
    earlier runs' own, else ``forkserver`` where there is one, else ``spawn`` (the module
    docstring says why)."""
    methods = multiprocessing.get_all_start_methods()
    alone = (
        _python_threads() <= _forks_beside["python"]
        and threads_in_process() <= _forks_beside["all"]
    )
    if "fork" in methods and alone:
        return multiprocessing.get_context("fork")
    return multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")


def adopt_run_threads() -> None:
    """Count the threads a run that forked its workers leaves behind (its tokenizer library's
    pool, started as it loaded) as runs' own: the next run in this process forks as this one
    did. Otherwise a script's second ``preprocess()`` call would start its workers from a fork
    server, which imports the script again (its calls included, where it has no ``__main__``
    guard, as Megatron's tool needs none)."""
    _forks_beside["all"] = max(_forks_beside["all"], threads_in_process())
    _forks_beside["python"] = max(_forks_beside["python"], _python_threads())


def describe_exit(exitcode: int | None) -> str:
    """How a process ended, from its ``multiprocessing`` exit code, in words."""
    if exitcode is None:
        return "is still running"
    if exitcode < 0:
        try:
            number = signal.Signals(-exitcode)
        except ValueError:
            return f"was killed by signal {-exitcode}"
        cause = SIGNAL_CAUSES.get(number)
        return f"was killed by {number.name} (signal {-exitcode})" + (f": {cause}" if cause else "")
    if exitcode == INITIALIZER_FAILED:
        return (
            "exited with status 0 before its work was done: its start (loading the tokenizer) "
            "failed, and the traceback under 'Exception in initializer' on stderr says why"
        )
    return f"exited with status {exitcode}"


class PoolWatch:
    """The worker processes of one pool, noted as they start, so that a broken pool can be
    explained: which worker ended and how."""

    def __init__(self) -> None:
        self._before = set(multiprocessing.active_children())
        self._workers: dict[int, multiprocessing.process.BaseProcess] = {}

    @property
    def before(self) -> set[multiprocessing.process.BaseProcess]:
        """The caller's own child processes, started before the pool's."""
        return self._before

    def note_workers(self, pool: object) -> None:
        """Note ``pool``'s processes started since the last call (after each submit: a pool
        starts its workers on the first submit, or one by one as work arrives). A worker that
        died at once is no longer among the live children: the executor's own table of its
        processes (CPython's ``ProcessPoolExecutor._processes``, filled within ``submit``)
        still holds it."""
        held = pool._processes if isinstance(pool, ProcessPoolExecutor) else None
        try:
            started = list((held or {}).values())
        except RuntimeError:  # changed while read (the pool replacing a worker): the live ones
            started = []
        for child in [*started, *(set(multiprocessing.active_children()) - self._before)]:
            if child.pid is not None:
                self._workers.setdefault(child.pid, child)

    def error(self, work: str) -> WorkerDiedError:
        """The error of a run whose pool broke while ``work`` (the input it waited for, in
        words) was in flight. Call it once the pool is stopped: every worker's end is known
        then."""
        ended = {pid: worker.exitcode for pid, worker in sorted(self._workers.items())}
        # the pool terminates the other workers after the first dies: name the first first
        first = [pid for pid, code in ended.items() if code != -signal.SIGTERM] or list(ended)
        described = [f"worker process {pid} {describe_exit(ended[pid])}" for pid in first]
        others = len(ended) - len(first)
        return WorkerDiedError(
            f"a preprocess worker ended while encoding {work}: "
            + ("; ".join(described) or "no worker process was found")
            + (f" (the pool then stopped the other {others})" if others else "")
        )

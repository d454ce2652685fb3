"""Running a function on several ranks of a real ``torch.distributed`` gloo group, spawned on
this machine: how ``mega dist demo``, the benchmark and the multi-rank tests start their ranks.

The function is looked up in its module's file by each spawned rank, so test modules that
pytest imported without a package work too.

Ranks are forked from a fork server that has imported torch once (``forkserver`` with torch
preloaded) instead of each starting a fresh interpreter and importing torch itself: on a
loaded 2-core machine that import costs seconds a rank. A forked rank takes the caller's
environment as it is at the call, as a spawned one would (the fork server's is the one it
started with). What torch and its thread libraries read from the environment once, at import
(``OMP_NUM_THREADS``, ``MKL_NUM_THREADS``), is read in the fork server, at the process's first
call: set those before it. The fork server is the process's one (multiprocessing's): torch
preloaded there serves every other user of it too.
"""

from __future__ import annotations

import contextlib
import importlib.util
import multiprocessing
import os
import queue
import sys
import tempfile
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch.distributed as dist


def _load(module_name: str, module_file: str, qualname: str) -> Callable[..., Any]:
    module = sys.modules.get(module_name)
    if module is None:
        spec = importlib.util.spec_from_file_location(module_name, module_file)
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
    target: Any = module
    for part in qualname.split("."):
        target = getattr(target, part)
    return target


def _rank_main(
    rank: int,
    world_size: int,
    rendezvous: str,
    where: tuple[str, str, str],
    args: tuple[Any, ...],
    results: Any,
    group_timeout: float,
    environment: dict[str, str],
) -> None:
    os.environ.clear()
    os.environ.update(environment)
    try:
        dist.init_process_group(
            "gloo",
            init_method=f"file://{rendezvous}",
            rank=rank,
            world_size=world_size,
            timeout=timedelta(seconds=group_timeout),
        )
        try:
            results.put((rank, "ok", _load(*where)(*args)))
            # A rank that finishes early must not close its sockets while another rank is
            # still connecting to a group they share: gloo fails that rank. The barrier fails
            # only when another rank failed or hung, and that rank's own report says why.
            with contextlib.suppress(RuntimeError):
                dist.barrier()
        finally:
            dist.destroy_process_group()
    except BaseException:  # report every failure to the parent, whatever it is
        results.put((rank, "error", traceback.format_exc()))


def _rank_context() -> multiprocessing.context.BaseContext:
    """The fork server's context, torch preloaded there (it starts at the first rank)."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["torch", "torch.distributed"])
    return context


def run_distributed(
    function: Callable[..., Any],
    world_size: int,
    *args: Any,
    timeout: float = 600.0,
    group_timeout: float = 300.0,
) -> list[Any]:
    """``function(*args)`` on ``world_size`` spawned ranks; the result of each rank, in order.

    Raises ``RuntimeError`` with the traceback of every rank that failed, and ``TimeoutError``
    naming the ranks still running after ``timeout`` seconds without a result (they are
    killed). ``group_timeout`` is the gloo group's. Both only bound a hang: the defaults leave
    room for a loaded machine, where starting a rank and importing torch alone can take a
    minute.
    """
    module = sys.modules[function.__module__]
    where = (function.__module__, os.path.abspath(module.__file__), function.__qualname__)
    context = _rank_context()
    results = context.Queue()
    with tempfile.TemporaryDirectory() as directory:
        rendezvous = os.path.join(directory, "rendezvous")
        every_rank = (rendezvous, where, args, results, group_timeout, dict(os.environ))
        ranks = [
            context.Process(target=_rank_main, args=(rank, world_size, *every_rank))
            for rank in range(world_size)
        ]
        for process in ranks:
            process.start()
        outcomes: dict[int, tuple[str, Any]] = {}
        try:
            while len(outcomes) < world_size:
                rank, status, value = results.get(timeout=timeout)
                outcomes[rank] = (status, value)
        except queue.Empty:
            missing = sorted(set(range(world_size)) - set(outcomes))
            raise TimeoutError(
                f"ranks {missing} of {world_size} did not finish within {timeout} s"
            ) from None
        finally:
            for process in ranks:
                process.join(timeout=5)
                if process.is_alive():
                    process.kill()
                    process.join()
    failures = [
        f"rank {rank}:\n{value}"
        for rank, (status, value) in sorted(outcomes.items())
        if status == "error"
    ]
    if failures:
        raise RuntimeError("distributed test failed on " + "\n".join(failures))
    return [outcomes[rank][1] for rank in range(world_size)]

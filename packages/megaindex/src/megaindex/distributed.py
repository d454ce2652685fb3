"""The little of torch.distributed that index building needs, usable without a process group.

Ranks coordinate through the process group's key-value store, with a timeout:

- A barrier: every rank announces itself and waits for the others; a rank that waits too long
  raises naming the ranks that did not arrive and what each was doing then (megatron-core's
  plain barrier hangs forever when one rank skips the dataset builder).
- What each rank is doing (:func:`report`: opening a corpus, building or loading a dataset's
  index, waiting at a barrier) is kept in the store, so that a timeout tells a rank still
  building a cold cache from one that never reached the builder.
- :func:`agree`: every rank publishes the description of what it is about to build and
  compares it with every other rank's before any cache is used; a difference raises
  :class:`ConfigMismatchError` on every rank, naming the fields and which ranks hold which
  value (ranks that build from different configs would each load their own cache and train on
  other data, silently).
"""

from __future__ import annotations

import itertools
import json
import time
from typing import Any

import torch

from megaindex.errors import ConfigError, MegaindexError

_barriers = itertools.count()
_agreements = itertools.count()
#: the longest value shown for a field in a ConfigMismatchError
SHOWN_CHARACTERS = 120


class BarrierTimeoutError(MegaindexError, TimeoutError):
    """Some ranks did not reach a dataset-building barrier in time."""


class ConfigMismatchError(ConfigError):
    """The ranks were given different dataset configurations (the message names the fields)."""


def global_rank() -> int | None:
    """This process's global rank, or None when no process group is initialised."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank()
    return None


def builds_shared_files() -> bool:
    """Whether this process writes shared caches: global rank 0, or a process on its own."""
    return global_rank() in (None, 0)


def _default_store() -> Any | None:
    try:
        return torch.distributed.distributed_c10d._get_default_store()
    except (AttributeError, RuntimeError, ValueError):
        return None


def _status_key(rank: int) -> str:
    return f"megaindex/status/{rank}"


def report(doing: str) -> None:
    """Record in the store what this rank is doing now (``doing``: "building the index of
    ..."), for the error of a rank that times out waiting for it."""
    rank, store = global_rank(), _default_store()
    if rank is not None and store is not None:
        store.set(_status_key(rank), json.dumps({"doing": doing, "since": time.time()}))


def _status(store: Any, rank: int) -> str:
    """What ``rank`` reported doing last, and for how long."""
    if not store.check([_status_key(rank)]):
        return f"rank {rank} never reached the dataset builder"
    status = json.loads(store.get(_status_key(rank)))
    return f"rank {rank} was {status['doing']} (for {time.time() - status['since']:.1f} s)"


def _wait_for_all(store: Any, key: str, timeout: float | None, where: str) -> None:
    """Wait until every rank has set ``key/rank/R``; after ``timeout`` seconds raise
    :class:`BarrierTimeoutError` naming the missing ranks and what they were doing."""
    rank, world = global_rank(), torch.distributed.get_world_size()
    keys = [f"{key}/rank/{r}" for r in range(world)]
    deadline = None if timeout is None else time.monotonic() + timeout
    pause = 0.001
    while not store.check(keys):
        if deadline is not None and time.monotonic() > deadline:
            missing = [r for r, k in enumerate(keys) if not store.check([k])]
            statuses = [_status(store, r) for r in missing]
            never = any(s.endswith("never reached the dataset builder") for s in statuses)
            hint = (
                "every rank must call BlendedMegatronDatasetBuilder.build(), those that hold no "
                "data too"
                if never
                else "raise barrier_timeout if building the index takes longer"
            )
            raise BarrierTimeoutError(
                f"rank {rank} waited {timeout:g} s {where} for ranks {missing} (of {world}): "
                f"{'; '.join(statuses)}; {hint}"
            )
        time.sleep(pause)
        pause = min(pause * 2, 0.05)


def barrier(timeout: float | None = None) -> None:
    """Wait for every rank (a no-op without a process group), at most ``timeout`` seconds."""
    rank = global_rank()
    if rank is None:
        return
    store = _default_store()
    if timeout is None or store is None:
        torch.distributed.barrier()
        return
    number = next(_barriers)
    report(f"waiting at dataset-building barrier {number}")
    key = f"megaindex/barrier/{number}"
    store.set(f"{key}/rank/{rank}", "1")
    _wait_for_all(store, key, timeout, "at a dataset-building barrier")


def agree(description: dict[str, str], timeout: float | None = None) -> None:
    """Raise :class:`ConfigMismatchError` on every rank unless every rank passed the same
    ``description`` (field name to its text); waits at most ``timeout`` seconds for the
    others. A no-op without a process group."""
    rank = global_rank()
    if rank is None:
        return
    world = torch.distributed.get_world_size()
    store = _default_store()
    if store is None:
        everyone: list[Any] = [None] * world
        torch.distributed.all_gather_object(everyone, description)
    else:
        report("comparing the dataset configs of the ranks")
        key = f"megaindex/agreement/{next(_agreements)}"
        store.set(f"{key}/rank/{rank}", json.dumps(description))
        _wait_for_all(store, key, timeout, "comparing the dataset configs of the ranks")
        everyone = [json.loads(store.get(f"{key}/rank/{r}")) for r in range(world)]
    differences = _differences(everyone)
    if differences:
        raise ConfigMismatchError(
            f"rank {rank}: the ranks were given different dataset configs, so each would use "
            f"its own index and train on other data: {'; '.join(differences)}. Expected the "
            "same config on every rank"
        )


def _differences(descriptions: list[dict[str, str]]) -> list[str]:
    """For each field whose text differs between ranks: which ranks hold which value."""
    fields = dict.fromkeys(name for description in descriptions for name in description)
    found = []
    for name in fields:
        holders: dict[str, list[int]] = {}
        for rank, description in enumerate(descriptions):
            holders.setdefault(description.get(name, "<absent>"), []).append(rank)
        if len(holders) > 1:
            shown = ", ".join(
                f"ranks {ranks} have {_shorten(value)}" for value, ranks in holders.items()
            )
            found.append(f"{name}: {shown}")
    return found


def _shorten(text: str) -> str:
    if len(text) <= SHOWN_CHARACTERS:
        return text
    return text[: SHOWN_CHARACTERS - 3] + "..."

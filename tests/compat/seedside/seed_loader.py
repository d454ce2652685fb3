"""Runs inside the seed worker: the seed commit's build_pretraining_data_loader on a dataset
whose split is given as an enum member the caller picked (ours or Megatron's own)."""

from __future__ import annotations

import types
from typing import Any


class IndexDataset:
    """Stands for a dataset: its length and its split; samples are their own index."""

    def __init__(self, length: int, split: Any) -> None:
        self.length, self.index_split = length, split

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> int:
        return index


def batches(
    length: int,
    split: Any,
    consumed: int,
    settings: dict,
    dp_rank: int,
    dp_size: int,
    count: int,
) -> list[list[int]]:
    """The first ``count`` index batches of the seed's loader for this rank. The data-parallel
    place and the arguments are stood in for during the call only (the worker may run Megatron's
    real groups afterwards)."""
    from megatron.core import parallel_state
    from megatron.training import global_vars
    from megatron.training.datasets import data_samplers

    saved = (
        parallel_state.get_data_parallel_rank,
        parallel_state.get_data_parallel_world_size,
        global_vars._GLOBAL_ARGS,
    )
    parallel_state.get_data_parallel_rank = lambda *a, **k: dp_rank
    parallel_state.get_data_parallel_world_size = lambda *a, **k: dp_size
    global_vars._GLOBAL_ARGS = types.SimpleNamespace(**settings)
    try:
        loader = data_samplers.build_pretraining_data_loader(IndexDataset(length, split), consumed)
        taken = []
        for batch in loader.batch_sampler:
            taken.append(list(batch))
            if len(taken) == count:
                break
        return taken
    finally:
        (
            parallel_state.get_data_parallel_rank,
            parallel_state.get_data_parallel_world_size,
            global_vars._GLOBAL_ARGS,
        ) = saved


def seed_split(name: str) -> Any:
    """The seed commit's own Split member."""
    from megatron.core.datasets.utils import Split

    return Split[name]

"""Runs inside the seed worker: a phased run as the seed commit runs it, one launch per phase:
each launch sizes its training split with training.py's formula at the phase's first
iteration, builds its datasets, and reads them from the phase's first sample."""

from __future__ import annotations

import types

import numpy


def restart_based_batches(
    phases: list[tuple[int, tuple]],
    train_samples: int,
    sizes: dict,
    config: dict,
    dp_rank: int,
) -> dict:
    """Every micro-batch's tokens this DP rank reads over the run, and each launch's sizes."""
    from megatron.core.datasets.blended_megatron_dataset_builder import (
        BlendedMegatronDatasetBuilder,
    )
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
    from megatron.training import global_vars, training
    from megatron.training.datasets.data_samplers import MegatronPretrainingSampler

    gbs, mbs, dp = sizes["global_batch_size"], sizes["micro_batch_size"], sizes["dp"]
    per_iteration = gbs // (mbs * dp)
    starts = [start for start, _ in phases]
    ends = [*starts[1:], train_samples // gbs]
    tokens, launches = [], []
    for (start, blend), end in zip(phases, ends, strict=True):
        global_vars._GLOBAL_ARGS = types.SimpleNamespace(
            train_samples=train_samples, train_iters=train_samples // gbs,
            global_batch_size=gbs, eval_global_batch_size=gbs, full_validation=False,
            skip_train=False, eval_interval=1000, eval_iters=1, start_eval_at_iter=None,
            phase_transition_iterations=starts[1:], iteration=start,
        )  # fmt: skip
        counts = training.get_train_valid_test_num_samples()
        launches.append(list(counts))
        train = BlendedMegatronDatasetBuilder(
            GPTDataset, list(counts), lambda: True, GPTDatasetConfig(blend=blend, **config)
        ).build()[0]
        sampler = MegatronPretrainingSampler(
            total_samples=len(train), consumed_samples=0, micro_batch_size=mbs,
            data_parallel_rank=dp_rank, data_parallel_size=dp,
        )  # fmt: skip
        for number, batch in enumerate(sampler):
            if number == (end - start) * per_iteration:
                break
            tokens.append(numpy.stack([train[index]["tokens"].numpy() for index in batch]))
    return {"tokens": tokens, "launches": launches}

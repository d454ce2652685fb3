"""Counting consumed samples the way Megatron-LM does: globally, all ranks together."""

from __future__ import annotations

from megaload.errors import SamplerError


def samples_per_step(micro_batch_size: int, data_parallel_size: int, num_micro_batches: int) -> int:
    """Samples one training step consumes: data_parallel_size x micro_batch_size x the number
    of micro-batches (Megatron-LM adds this to consumed_train_samples after every step)."""
    return data_parallel_size * micro_batch_size * num_micro_batches


def num_micro_batches(
    global_batch_size: int, micro_batch_size: int, data_parallel_size: int
) -> int:
    """Micro-batches per step on each rank."""
    per_micro_step = micro_batch_size * data_parallel_size
    if global_batch_size % per_micro_step:
        raise SamplerError(
            f"global_batch_size {global_batch_size} is not a multiple of micro_batch_size "
            f"{micro_batch_size} x data_parallel_size {data_parallel_size}"
        )
    return global_batch_size // per_micro_step


def consumed_after(iteration: int, global_batch_size: int) -> int:
    """Samples consumed after ``iteration`` steps of a constant global batch size (how
    Megatron-LM fills in consumed_train_samples for checkpoints that lack it)."""
    return iteration * global_batch_size

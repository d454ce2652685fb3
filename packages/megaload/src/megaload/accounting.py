"""Counting consumed samples the way Megatron-LM does: globally, all ranks together."""

from __future__ import annotations

from megaload.errors import BackfillError, SamplerError


def samples_per_step(micro_batch_size: int, data_parallel_size: int, num_micro_batches: int) -> int:
    """Samples one training step consumes: data_parallel_size x micro_batch_size x the number
    of micro-batches (Megatron-LM adds this to consumed_train_samples after every step)."""
    return data_parallel_size * micro_batch_size * num_micro_batches


def num_micro_batches(
    global_batch_size: int, micro_batch_size: int, data_parallel_size: int, *, prefix: str = ""
) -> int:
    """Micro-batches per step on each rank; ``prefix`` names the batch sizes in the error
    (``"eval_"`` for the evaluation loaders')."""
    per_micro_step = micro_batch_size * data_parallel_size
    if global_batch_size % per_micro_step:
        raise SamplerError(
            f"{prefix}global_batch_size {global_batch_size} is not a multiple of "
            f"{prefix}micro_batch_size {micro_batch_size} x data_parallel_size "
            f"{data_parallel_size}"
        )
    return global_batch_size // per_micro_step


def consumed_after(iteration: int, global_batch_size: int) -> int:
    """Samples consumed after ``iteration`` steps of a constant global batch size (how
    Megatron-LM fills in consumed_train_samples for checkpoints that lack it)."""
    return iteration * global_batch_size


def backfilled_consumed(
    iteration: int,
    consumed_train_samples: int,
    consumed_valid_samples: int,
    *,
    global_batch_size: int,
    train_samples: int | None = None,
    eval_interval: int | None = None,
    eval_iters: int = 0,
    eval_global_batch_size: int | None = None,
    start_eval_at_iter: int | None = None,
) -> tuple[int, int]:
    """The consumed train and valid samples to resume from, for a checkpoint of a run at
    ``iteration`` whose counts may be missing (0), as Megatron-LM's training.py fills them in:
    ``iteration x global_batch_size`` train samples, and the validation batches of every
    evaluation point passed (from ``start_eval_at_iter`` on). Only an iteration-based run can
    be filled in: with ``train_samples`` the batch size may have changed on the way, and a
    missing train count is refused (:class:`BackfillError`). So is a missing valid count
    without an ``eval_interval`` (0 or None, as ``--skip-train`` runs may have), where
    Megatron-LM divides by it and fails; with no ``eval_iters`` nothing was evaluated, and the
    count is 0."""
    train, valid = consumed_train_samples, consumed_valid_samples
    if iteration > 0 and train == 0:
        if train_samples is not None:
            raise BackfillError(
                f"the checkpoint at iteration {iteration} records no consumed_train_samples, and "
                f"a sample-based run (train_samples {train_samples}) cannot infer them: only "
                f"iteration-based training is filled in as iteration x global_batch_size"
            )
        train = consumed_after(iteration, global_batch_size)
    if iteration > 0 and valid == 0 and train_samples is None:
        if eval_iters and not eval_interval:
            raise BackfillError(
                f"the checkpoint at iteration {iteration} records no consumed_valid_samples, and "
                f"with eval_iters {eval_iters} they are counted per evaluation interval, but "
                f"eval_interval is {eval_interval!r}: give the eval_interval the run trained "
                "with, or the checkpoint's consumed_valid_samples"
            )
        skipped = (start_eval_at_iter or 0) // eval_interval if eval_iters else 0
        points = max(0, iteration // eval_interval - skipped) if eval_iters else 0
        valid = points * eval_iters * (eval_global_batch_size or global_batch_size)
    return train, valid


def consumed_in_phase(
    iteration: int,
    global_batch_size: int,
    consumed_train_samples: int,
    phase_transition_iterations: list[int] | None = None,
) -> int:
    """Where the training loader of the current phase starts: the samples consumed since the
    phase's first iteration (Megatron-LM restarts at each transition with the next phase's
    dataset), or ``consumed_train_samples`` without phases."""
    if not phase_transition_iterations:
        return consumed_train_samples
    start = max(t for t in (0, *phase_transition_iterations) if t <= iteration)
    return (iteration - start) * global_batch_size

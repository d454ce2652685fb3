"""How many samples each split needs, with Megatron-LM's formulas (training.py).

train: ``train_samples``, else ``train_iters * global_batch_size``.
valid: every evaluation point of the run, ``(train_iters // eval_interval + 1) * eval_iters``
batches of ``eval_global_batch_size`` (default: the global batch size); None with
``full_validation`` (one whole epoch is used instead).
test: ``eval_iters`` batches of the evaluation batch size.
"""

from __future__ import annotations

from megaindex.errors import ConfigError


def get_train_valid_test_num_samples(
    global_batch_size: int,
    train_iters: int | None = None,
    train_samples: int | None = None,
    eval_interval: int | None = None,
    eval_iters: int = 0,
    eval_global_batch_size: int | None = None,
    full_validation: bool = False,
) -> tuple[int, int | None, int]:
    """``(train, valid, test)`` sample counts for ``BlendedMegatronDatasetBuilder``."""
    if global_batch_size is None or global_batch_size < 1:
        raise ConfigError(f"global_batch_size must be positive, got {global_batch_size}")
    if train_iters is None:
        if train_samples is None:
            raise ConfigError("give train_iters or train_samples")
        train_iters = train_samples // global_batch_size  # as Megatron-LM derives it
    train = train_samples if train_samples else train_iters * global_batch_size
    eval_batch = eval_global_batch_size or global_batch_size
    if full_validation:
        valid = None
    elif eval_iters and eval_interval:
        valid = (train_iters // eval_interval + 1) * eval_iters * eval_batch
    elif eval_iters:
        raise ConfigError("eval_iters needs eval_interval to count the evaluation points")
    else:
        valid = 0
    return train, valid, eval_iters * eval_batch

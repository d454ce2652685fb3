"""Runs inside the seed worker: what training.py's build_train_valid_test_data_loaders asks of
the datasets (the sample counts) and the consumed counts it fills in, for given arguments."""

from __future__ import annotations

import contextlib
import types


class Captured(Exception):
    """Stops training.py once it has asked for the datasets."""


def budget(settings: dict) -> dict:
    """The seed's sample counts and consumed counts (after its backfill) for ``settings``."""
    from megatron.core import parallel_state
    from megatron.training import global_vars, training

    parallel_state.get_tensor_model_parallel_rank = lambda *a, **k: 0
    args = types.SimpleNamespace(**settings)
    global_vars._GLOBAL_ARGS = args
    if args.train_iters is None:
        from megatron.core.num_microbatches_calculator import (
            destroy_num_microbatches_calculator,
            init_num_microbatches_calculator,
        )

        destroy_num_microbatches_calculator()
        init_num_microbatches_calculator(
            rank=1,
            global_batch_size=None if args.step_batch_size_schedule else args.global_batch_size,
            micro_batch_size=args.micro_batch_size,
            data_parallel_size=args.data_parallel_size,
            step_batch_size_schedule=args.step_batch_size_schedule,
            seq_length=args.seq_length if args.schedule_in_tokens else None,
        )
        training.update_train_iters(args)
    seen = {}

    def provider(counts):
        seen["counts"] = list(counts)
        raise Captured

    with contextlib.suppress(Captured):
        training.build_train_valid_test_data_loaders(provider)
    return {
        "counts": seen["counts"],
        "train_iters": args.train_iters,
        "consumed_train_samples": args.consumed_train_samples,
        "consumed_valid_samples": args.consumed_valid_samples,
    }

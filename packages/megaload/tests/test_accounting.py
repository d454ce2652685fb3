"""Resume accounting: consumed counts filled in for old checkpoints, and phases' starts."""

from __future__ import annotations

import pytest

from megaload import BackfillError, backfilled_consumed, consumed_in_phase


def test_missing_counts_are_filled_in_for_iteration_based_runs():
    # iteration 25 of 8 samples; evaluation every 10 (2 points passed) of 3 batches of 4
    assert backfilled_consumed(
        25, 0, 0, global_batch_size=8, eval_interval=10, eval_iters=3, eval_global_batch_size=4
    ) == (200, 2 * 3 * 4)
    # evaluation starting at iteration 20 skips the first two intervals: none passed yet
    assert backfilled_consumed(
        25, 0, 0, global_batch_size=8, eval_interval=10, eval_iters=3, start_eval_at_iter=20
    ) == (200, 0)
    # recorded counts are kept
    assert backfilled_consumed(25, 150, 9, global_batch_size=8, eval_interval=10) == (150, 9)


def test_a_sample_based_run_without_counts_is_refused_as_megatron_asserts():
    with pytest.raises(BackfillError, match="cannot infer") as raised:
        backfilled_consumed(3, 0, 0, global_batch_size=8, train_samples=100)
    assert isinstance(raised.value, AssertionError)


def test_a_missing_valid_count_without_eval_interval():
    """eval_interval 0 (a --skip-train run): nothing evaluated counts 0; evaluations of an
    unknown interval are refused, naming eval_interval (Megatron-LM divides by it)."""
    assert backfilled_consumed(5, 40, 0, global_batch_size=8, eval_interval=0) == (40, 0)
    with pytest.raises(BackfillError, match="eval_interval is 0"):
        backfilled_consumed(5, 40, 0, global_batch_size=8, eval_interval=0, eval_iters=2)
    assert backfilled_consumed(5, 40, 16, global_batch_size=8, eval_interval=0, eval_iters=2) == (
        40,
        16,
    )


def test_a_phase_starts_its_loader_at_its_own_first_sample():
    assert consumed_in_phase(7, 4, 28, [5, 12]) == 8
    assert consumed_in_phase(7, 4, 28) == 28

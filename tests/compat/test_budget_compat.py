"""Sample budgets and resume accounting against the seed commit's training.py: the sample
counts it asks of the datasets (start_eval_at_iter, skip_train, full validation, step
batch-size schedules, phase transitions) and the consumed counts it fills in for checkpoints
that lack them, over seeded random arguments."""

from __future__ import annotations

import random

import pytest
from seedref import SeedRaised

from megaindex import StepBatchSizeSchedule, get_train_valid_test_num_samples
from megaload import BackfillError, backfilled_consumed, consumed_in_phase

pytestmark = pytest.mark.compat

CASES = 60


def random_arguments(rng: random.Random) -> dict:
    micro, dp = rng.choice([1, 2]), rng.choice([1, 2, 4])
    gbs = micro * dp * rng.choice([1, 2, 4])
    sample_based = rng.random() < 0.5
    schedule = None
    if sample_based and rng.random() < 0.5:
        first = micro * dp
        schedule = f"0:{first} {rng.randint(1, 40)}:{first * 2} {rng.randint(41, 90)}:{first * 4}"
    train_samples = rng.randint(gbs, 300) if sample_based else None
    phases = None
    if sample_based and schedule is None and rng.random() < 0.4:
        last = train_samples // gbs
        phases = sorted(rng.sample(range(1, max(2, last)), k=min(2, max(1, last - 1))))
    eval_interval = rng.choice([1, 3, 5, 10])
    return {
        "micro_batch_size": micro,
        "data_parallel_size": dp,
        # with a schedule, Megatron-LM sets the global batch size to micro x dp
        "global_batch_size": micro * dp if schedule else gbs,
        "eval_global_batch_size": rng.choice([None, micro * dp])
        or (micro * dp if schedule else gbs),
        "train_iters": None if sample_based else rng.randint(1, 60),
        "train_samples": train_samples,
        "step_batch_size_schedule": schedule,
        "schedule_in_tokens": False,
        "seq_length": 16,
        "eval_interval": eval_interval,
        "eval_iters": rng.choice([0, 1, 3]),
        "full_validation": rng.random() < 0.15,
        "skip_train": rng.random() < 0.15,
        "start_eval_at_iter": rng.choice([None, None, 0, 4, 12]),
        "phase_transition_iterations": phases,
        "iteration": 0,
        "consumed_train_samples": 0,
        "consumed_valid_samples": 0,
        "perform_rl_step": False,
    }


def ours(arguments: dict) -> dict:
    schedule = arguments["step_batch_size_schedule"]
    counts = get_train_valid_test_num_samples(
        arguments["global_batch_size"],
        train_iters=arguments["train_iters"],
        train_samples=arguments["train_samples"],
        eval_interval=arguments["eval_interval"],
        eval_iters=arguments["eval_iters"],
        eval_global_batch_size=arguments["eval_global_batch_size"],
        full_validation=arguments["full_validation"],
        skip_train=arguments["skip_train"],
        start_eval_at_iter=arguments["start_eval_at_iter"],
        step_batch_size_schedule=StepBatchSizeSchedule.parse(schedule) if schedule else None,
        phase_transition_iterations=arguments["phase_transition_iterations"],
        iteration=arguments["iteration"],
    )
    train, valid = backfilled_consumed(
        arguments["iteration"],
        arguments["consumed_train_samples"],
        arguments["consumed_valid_samples"],
        global_batch_size=arguments["global_batch_size"],
        train_samples=arguments["train_samples"],
        eval_interval=arguments["eval_interval"],
        eval_iters=arguments["eval_iters"],
        eval_global_batch_size=arguments["eval_global_batch_size"],
        start_eval_at_iter=arguments["start_eval_at_iter"],
    )
    return {
        "counts": list(counts),
        "consumed_train_samples": train,
        "consumed_valid_samples": valid,
    }


def resume(rng: random.Random, arguments: dict) -> None:
    """Maybe make ``arguments`` a resumed run, maybe from a checkpoint without consumed counts."""
    if rng.random() < 0.5:
        arguments["iteration"] = rng.randint(1, 8)
        if arguments["phase_transition_iterations"]:
            arguments["iteration"] = min(
                arguments["iteration"],
                arguments["train_samples"] // arguments["global_batch_size"] - 1,
            )
        if rng.random() < 0.5:
            arguments["consumed_train_samples"] = (
                arguments["iteration"] * arguments["global_batch_size"]
            )


def assert_equals_the_seed(seed, case: int, arguments: dict) -> None:
    """Our counts and backfilled consumed counts are the seed's, or both refuse."""
    try:
        reference = seed.call("seed_budget:budget", arguments)
    except SeedRaised as raised:
        if raised.is_a("ZeroDivisionError"):  # a missing valid count, without eval_interval
            assert not arguments["eval_interval"] and not arguments["consumed_valid_samples"]
            if not arguments["eval_iters"]:  # nothing was evaluated: 0 here, on purpose
                assert ours(arguments)["consumed_valid_samples"] == 0, case
                return
        else:
            assert raised.is_a("AssertionError"), raised
        with pytest.raises(BackfillError):
            ours(arguments)
        return
    mine = ours(arguments)
    assert mine["counts"] == reference["counts"], (case, arguments, reference)
    assert mine["consumed_train_samples"] == reference["consumed_train_samples"], case
    assert mine["consumed_valid_samples"] == reference["consumed_valid_samples"], case
    if arguments["phase_transition_iterations"]:
        start = consumed_in_phase(
            arguments["iteration"],
            arguments["global_batch_size"],
            mine["consumed_train_samples"],
            arguments["phase_transition_iterations"],
        )
        assert 0 <= start < mine["counts"][0]


@pytest.mark.parametrize("case", range(CASES))
def test_budget_and_backfill_equal_the_seed_commit_s(seed, case: int) -> None:
    rng = random.Random(case)
    arguments = random_arguments(rng)
    resume(rng, arguments)
    assert_equals_the_seed(seed, case, arguments)


@pytest.mark.parametrize("case", range(20))
def test_skip_train_without_eval_interval_equals_the_seed_commit_s(seed, case: int) -> None:
    """``--skip-train --eval-interval 0`` (evaluation only): the seed reads no interval for the
    budget. Resumed from a checkpoint that lacks its consumed validation samples (half the
    resumed cases), the seed's backfill divides by the interval and fails: ours refuses with a
    BackfillError naming eval_interval, or, with no eval_iters (nothing was evaluated), counts
    0."""
    rng = random.Random(f"skip-train-{case}")
    arguments = random_arguments(rng)
    arguments.update(skip_train=True, eval_interval=0)
    resume(rng, arguments)
    if arguments["iteration"] and rng.random() < 0.5:
        arguments["consumed_valid_samples"] = arguments["eval_global_batch_size"]
    assert_equals_the_seed(seed, case, arguments)

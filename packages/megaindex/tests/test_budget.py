import pytest

from megaindex import ConfigError, StepBatchSizeSchedule, get_train_valid_test_num_samples


def test_iteration_based_budget():
    # 1000 iterations of 32; evaluation every 100 iterations (11 points) of 5 batches
    assert get_train_valid_test_num_samples(
        32, train_iters=1000, eval_interval=100, eval_iters=5
    ) == (32000, 11 * 5 * 32, 5 * 32)


def test_sample_based_budget_and_evaluation_batch():
    # 10000 samples of 64 -> 156 iterations; 4 points (0, 50, 100, 150) of 2 batches of 16
    assert get_train_valid_test_num_samples(
        64, train_samples=10000, eval_interval=50, eval_iters=2, eval_global_batch_size=16
    ) == (10000, 4 * 2 * 16, 2 * 16)


def test_full_validation_and_no_evaluation():
    assert get_train_valid_test_num_samples(
        8, train_iters=10, eval_interval=5, eval_iters=3, full_validation=True
    ) == (80, None, 24)
    assert get_train_valid_test_num_samples(8, train_iters=10) == (80, 0, 0)


def test_budget_errors():
    with pytest.raises(ConfigError, match="give train_iters or train_samples"):
        get_train_valid_test_num_samples(8)
    for interval in (None, 0):
        with pytest.raises(ConfigError, match="eval_iters 2 needs an eval_interval of at least 1"):
            get_train_valid_test_num_samples(
                8, train_iters=10, eval_iters=2, eval_interval=interval
            )


def test_start_eval_at_iter_and_skip_train():
    # 100 iterations, evaluation every 10: 11 points, the 3 before iteration 30 skipped
    assert get_train_valid_test_num_samples(
        4, train_iters=100, eval_interval=10, eval_iters=2, start_eval_at_iter=30
    ) == (400, 8 * 2 * 4, 2 * 4)
    # no training: one evaluation of eval_iters batches
    assert get_train_valid_test_num_samples(
        4, train_iters=100, eval_interval=10, eval_iters=2, skip_train=True
    ) == (400, 2 * 4, 2 * 4)


def test_a_step_schedule_counts_iterations_of_growing_batches():
    # 8 per step until 16 samples, then 16: 8, 8 (16 consumed), then 16 x 5 = 96 > 90
    schedule = StepBatchSizeSchedule.parse("0:8 16:16")
    assert schedule.batch_size_at(15) == 8 and schedule.batch_size_at(16) == 16
    assert schedule.iterations_for(90) == 7
    # thresholds in tokens with a sequence length: 3.2K tokens of 64 = 50 samples
    assert StepBatchSizeSchedule.parse("0:4, 3.2k:8", seq_length=64).steps == ((0, 4), (50, 8))
    # 7 iterations, evaluation every 2: 4 points
    assert get_train_valid_test_num_samples(
        8, train_samples=90, eval_interval=2, eval_iters=1, step_batch_size_schedule=schedule
    ) == (90, 4 * 8, 8)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("8:4", "starts at threshold 0"),
        ("0:4 0:8", "thresholds must increase"),
        ("0:4 x:8", "'x' is not a number"),
        ("0-4", "expected THRESHOLD:BATCH_SIZE"),
    ],
)
def test_bad_schedules_are_named(text, match):
    with pytest.raises(ConfigError, match=match):
        StepBatchSizeSchedule.parse(text)


def test_phases_count_the_samples_of_the_current_phase():
    # transitions at iterations 5 and 12 of 4 samples; 100 samples in all
    counts = dict(global_batch_size=4, train_samples=100, phase_transition_iterations=[5, 12])
    assert get_train_valid_test_num_samples(**counts, iteration=0)[0] == 20
    assert get_train_valid_test_num_samples(**counts, iteration=7)[0] == 28
    assert get_train_valid_test_num_samples(**counts, iteration=12)[0] == 52
    with pytest.raises(ConfigError, match="past the last phase"):
        get_train_valid_test_num_samples(**counts, iteration=25)

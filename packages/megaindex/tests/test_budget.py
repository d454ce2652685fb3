import pytest

from megaindex import ConfigError, get_train_valid_test_num_samples


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
    with pytest.raises(ConfigError, match="eval_iters needs eval_interval"):
        get_train_valid_test_num_samples(8, train_iters=10, eval_iters=2)

"""``mega index build`` with Megatron-LM's tools/prepare_cache.py flags (the compatibility test
against the tool itself is tests/compat/test_prepare_cache_compat.py)."""

import pytest

from megafmt.cli.main import main
from megaindex.dataset_flags import data_parallel_size


def build(corpus, cache, *flags):
    return main(
        ["index", "build", "--data-path", corpus, "--seq-length", "32", "--split", "90,8,2",
         "--null-tokenizer", "1000", "--data-cache-path", cache, *flags]
    )  # fmt: skip


def built_train_samples(capsys) -> int:
    line = capsys.readouterr().out.splitlines()[0].split()
    assert line[0] == "train"
    return int(line[1].replace(",", ""))


def test_the_micro_batch_and_world_size_set_the_global_batch_size(corpus, tmp_path, capsys):
    flags = ["--train-iters", "100", "--micro-batch-size", "2", "--prepare-cache-world-size", "8"]
    for tensor_parallel, samples in (("1", 1600), ("2", 800)):
        cache = str(tmp_path / tensor_parallel)
        assert build(corpus, cache, *flags, "--tensor-model-parallel-size", tensor_parallel) == 0
        assert built_train_samples(capsys) >= samples  # at least train_iters x 2 x 8 / tp
        assert (tmp_path / tensor_parallel).is_dir()  # --data-cache-path is the cache folder


def test_a_global_batch_size_the_layout_cannot_split_is_refused(corpus, tmp_path, capsys):
    flags = ["--train-iters", "5", "--micro-batch-size", "2", "--global-batch-size", "6"]
    assert build(corpus, str(tmp_path), *flags, "--prepare-cache-world-size", "2") == 1
    assert "--global-batch-size 6 is not a multiple of" in capsys.readouterr().err


def test_the_world_size_must_hold_the_model_layout(corpus, tmp_path, capsys):
    flags = ["--train-iters", "5", "--micro-batch-size", "1", "--prepare-cache-world-size", "3"]
    assert build(corpus, str(tmp_path), *flags, "--tensor-model-parallel-size", "2") == 1
    assert "world size 3 is not a multiple of" in capsys.readouterr().err


def test_world_size_defaults_to_the_launcher_s(monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse

    args = argparse.Namespace(
        prepare_cache_world_size=None, tensor_model_parallel_size=2,
        pipeline_model_parallel_size=1, context_parallel_size=1,
    )  # fmt: skip
    monkeypatch.setenv("WORLD_SIZE", "8")
    assert data_parallel_size(args) == 4
    monkeypatch.delenv("WORLD_SIZE")
    with pytest.raises(ValueError, match="world size 1"):
        data_parallel_size(args)


def test_mock_data_builds_mock_datasets(tmp_path, capsys):
    flags = ["--seq-length", "16", "--null-tokenizer", "1000", "--samples", "40,4,4"]
    assert main(["index", "build", *flags]) == 1  # no data without it
    assert "give the data" in capsys.readouterr().err
    assert main(["index", "build", "--mock-data", *flags]) == 0
    assert "(not cached)" in capsys.readouterr().out.splitlines()[0]  # mock tables stay in memory


def test_rampup_is_taken_and_ignored_as_at_the_seed_commit(corpus, tmp_path, capsys):
    flags = ["--train-iters", "10", "--global-batch-size", "4"]
    assert build(corpus, str(tmp_path / "a"), *flags) == 0
    plain = built_train_samples(capsys)
    with pytest.warns(DeprecationWarning, match="rampup"):
        assert build(corpus, str(tmp_path / "b"), *flags, "--rampup-batch-size", "1", "1", "8") == 0
    assert built_train_samples(capsys) == plain


def test_cache_load_only_flags_are_set_aside_when_building(corpus, tmp_path, capsys):
    flags = ["--samples", "100,10,10", "--dataloader-fast-cache-load"]
    assert build(corpus, str(tmp_path), *flags, "--dataloader-defer-npy-index-mmap") == 0
    out = capsys.readouterr().out.splitlines()
    assert out[:2] == [
        "> ignoring --dataloader-fast-cache-load during cache preparation",
        "> ignoring --dataloader-defer-npy-index-mmap during cache preparation",
    ]
    assert out[2].split()[2:4] == ["samples", "built"]  # built, not trusted from a cache

"""Reliability: bad arguments of every ``mega`` command stop before any work, naming the
argument, the value and what is allowed; index tables too large for the machine are refused
before they are allocated, naming the settings that size them."""

from __future__ import annotations

import math
import re
import time

import numpy
import pytest

from megafmt import write_manifest
from megafmt.cli.main import main
from megafmt.testing import write_corpus
from megaindex import (
    BlendedMegatronDatasetBuilder,
    ConfigError,
    GPTDataset,
    GPTDatasetConfig,
    IndexBuildError,
    TokenRangeError,
    get_blend_and_blend_per_split,
    get_train_valid_test_num_samples,
    memory,
)
from megaindex.tokenizer import IdentifiedTokenizer

INDEX = ["--split", "99,1,0", "--null-tokenizer", "1000", "--global-batch-size", "4"]

SIMULATE = [
    "load",
    "simulate",
    "--data-path",
    "c",
    "--seq-length",
    "8",
    *INDEX,
    "--train-iters",
    "2",
]
CASES = [
    ([*SIMULATE, "--micro-batch-size", "2", "--dp", "0"], "--dp", "an integer >= 1, got 0"),
    ([*SIMULATE, "--micro-batch-size", "x"], "--micro-batch-size", "an integer, got 'x'"),
    (
        [*SIMULATE, "--micro-batch-size", "2", "--resume-at", "12.7"],
        "--resume-at",
        "an integer, got '12.7'",
    ),
    (["dist", "demo", "--tp", "0"], "--tp", "an integer >= 1, got 0"),
    (["dist", "demo", "--seq-length", "-3"], "--seq-length", "an integer >= 1, got -3"),
    (
        ["index", "build", "--data-path", "c", "--seq-length", "0", *INDEX, "--train-iters", "2"],
        "--seq-length",
        "an integer >= 1, got 0",
    ),
    (
        [
            "index",
            "build",
            "--data-path",
            "c",
            "--seq-length",
            "8",
            *INDEX,
            "--train-samples",
            "-5",
        ],
        "--train-samples",
        "an integer >= 0, got -5",
    ),
    (
        ["preprocess", "--input", "x.jsonl", "--output-prefix", "o", "--workers", "0"],
        "--workers",
        "an integer >= 1, got 0",
    ),
]


@pytest.mark.parametrize(
    ("argv", "argument", "what"), CASES, ids=[" ".join([*case[0][:2], case[1]]) for case in CASES]
)
def test_bad_command_line_arguments_are_named(capsys, argv, argument, what):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    assert f"error: argument {argument}: expected {what}" in capsys.readouterr().err


def config(tmp_path, sequence_length: int, **overrides) -> GPTDatasetConfig:
    corpus = write_corpus(str(tmp_path / "corpus"))
    fields = {
        "blend": ([corpus], None),
        "split": "90,8,2",
        "tokenizer": IdentifiedTokenizer.null(1000),
        **overrides,
    }
    return GPTDatasetConfig(
        random_seed=1234,
        sequence_length=sequence_length,
        path_to_cache=str(tmp_path / "cache"),
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
        **fields,
    )


def build(config: GPTDatasetConfig):
    return BlendedMegatronDatasetBuilder(GPTDataset, [1000, 50, 10], lambda: True, config).build()


def test_a_huge_sequence_length_is_refused_before_allocating(tmp_path):
    with pytest.raises(IndexBuildError, match=r"^GPTDataset samples: needs") as caught:
        build(config(tmp_path, sequence_length=10**12))
    assert "sequence_length 1000000000000" in str(caught.value)
    assert "TiB available" in str(caught.value) or "GiB available" in str(caught.value)
    with pytest.raises(IndexBuildError, match=r"with create_attention_mask \(length squared\)"):
        build(config(tmp_path, sequence_length=10**7, create_attention_mask=True))


def test_tables_larger_than_the_memory_are_refused_before_allocating(tmp_path):
    with pytest.raises(IndexBuildError, match=r"corpus \(train split\): needs") as caught:
        BlendedMegatronDatasetBuilder(
            GPTDataset, [10**11, 50, 10], lambda: True, config(tmp_path, sequence_length=32)
        ).build()
    message = str(caught.value)
    assert "document_index" in message and "shuffle_index" in message
    assert f"num_samples {10**11} of sequence_length 32 tokens" in message


def test_the_estimate_is_checked_against_what_is_available(tmp_path, monkeypatch):
    monkeypatch.setattr(memory, "available_memory", lambda: 4096)  # a sample fits, not tables
    with pytest.raises(IndexBuildError, match=r"has 4.0 KiB available.*sequence_length 32 "):
        build(config(tmp_path, sequence_length=32))
    monkeypatch.setattr(memory, "available_memory", lambda: None)  # unknown: not refused
    assert len(build(config(tmp_path, sequence_length=32))[0]) >= 1000


def test_available_memory_reads_the_kernel_figures():
    available = memory.available_memory()
    assert available is None or available > 0


def test_the_kernel_figures_are_read_at_most_every_half_second(monkeypatch):
    reads = []
    monkeypatch.setattr(memory, "_read_available", lambda: reads.append(1) or 1000 * len(reads))
    monkeypatch.setattr(memory, "_last_read", [])
    assert [memory.available_memory() for _ in range(100)] == [1000] * 100  # one read
    stale = time.monotonic() - memory.REREAD_SECONDS
    monkeypatch.setattr(memory, "_last_read", [(stale, 1000)])
    assert memory.available_memory() == 2000  # read again: the figures are older than that


BLEND_CASES = [  # (the weights of a blend of the corpus repeated; the message)
    ([math.nan, 1.0], "blend: the weight of 'C' is nan"),
    ([math.inf, 1.0], "blend: the weight of 'C' is inf"),
    ([-1.0, 2.0], "blend: the weight of 'C' is -1.0"),
    ([0.0, 0.0], r"blend: the weights \[0.0, 0.0\] are all zero"),
    ([], "blend holds no prefix"),
]


@pytest.mark.parametrize(("weights", "message"), BLEND_CASES, ids=[c[1][:24] for c in BLEND_CASES])
def test_bad_blend_weights_name_the_field_and_value(tmp_path, weights, message):
    corpus = config(tmp_path, 8).blend[0][0]
    blend = ([corpus] * len(weights), weights or None)
    for fields, field in (
        ({"blend": blend}, "blend"),
        ({"blend": None, "split": None, "blend_per_split": [blend, None, None]}, "train"),
    ):
        with pytest.raises(ConfigError) as caught:
            build(config(tmp_path, 8, **fields))
        assert isinstance(caught.value, AssertionError)  # megatron-core asserts there
        expected = message.replace("'C'", repr(corpus))
        if field == "train":
            expected = expected.replace("blend", r"blend_per_split\[train\]", 1)
        assert re.search(expected, str(caught.value))


@pytest.mark.parametrize(
    ("items", "argument"),
    [
        (["nan", "c"], "--data-path: the weight of 'c' is nan"),
        (["inf", "c", "1", "d"], "--data-path: the weight of 'c' is inf"),
        (["0", "c", "0", "d"], "--data-path: the weights .* are all zero"),
    ],
)
def test_bad_data_path_weights_name_the_flag(capsys, items, argument):
    assert main(["index", "build", "--data-path", *items, "--seq-length", "8", *INDEX]) != 0
    assert re.search(argument, capsys.readouterr().err)


def test_per_split_weights_name_their_flag():
    with pytest.raises(ConfigError, match="--valid-data-path: the weight of 'v' is nan"):
        get_blend_and_blend_per_split(train_data_path=["t"], valid_data_path=["nan", "v"])


@pytest.mark.parametrize(
    ("counts", "message"),
    [
        ({"train_iters": -5}, "train_iters must be an integer >= 0, got -5"),
        ({"train_samples": -5}, "train_samples must be an integer >= 0, got -5"),
        ({"train_iters": 5, "eval_interval": 2, "eval_iters": -1}, "eval_iters must be an"),
        ({"train_iters": 5, "eval_interval": -1, "eval_iters": 1}, "eval_interval must be an"),
        (
            {"train_iters": 5, "eval_interval": 0, "eval_iters": 1},
            "eval_iters 1 needs an eval_interval of at least 1 .* found 0; .* or skip_train",
        ),
    ],
)
def test_negative_sample_budgets_are_refused(counts, message):
    with pytest.raises(ConfigError, match=message):
        get_train_valid_test_num_samples(4, **counts)


def test_split_sizes_that_are_not_integers_are_refused(tmp_path):
    for sizes, name in (([2.5, 10, 10], r"sizes\[0\] \(the train"), ([5, 10, "1"], r"sizes\[2\]")):
        with pytest.raises(ConfigError, match=name + r".* expected an integer, or None"):
            BlendedMegatronDatasetBuilder(GPTDataset, sizes, lambda: True, config(tmp_path, 8))


def test_a_negative_split_size_builds_one_epoch_and_a_blend_refuses_it(tmp_path):
    """As megatron-core: a corpus asked for a negative count builds one epoch; a blend that
    must draw a negative count refuses it (megatron-core's numpy raises a ValueError)."""
    single = config(tmp_path, 8)
    train = BlendedMegatronDatasetBuilder(GPTDataset, [-5, 10, 10], lambda: True, single).build()
    assert train[0].num_samples == -5 and train[0].epoch_plan.num_epochs == 1
    blended = config(tmp_path, 8, blend=([single.blend[0][0]] * 2, None))
    with pytest.raises(ConfigError, match="cannot draw -5 samples"):
        BlendedMegatronDatasetBuilder(GPTDataset, [-5, 10, 10], lambda: True, blended).build()


def test_negative_sample_counts_on_the_command_line(capsys):
    argv = ["index", "build", "--data-path", "c", "--seq-length", "8", *INDEX, "--samples"]
    with pytest.raises(SystemExit):
        main([*argv, "10,-3,0"])
    assert "argument --samples: expected an integer >= 0, got -3" in capsys.readouterr().err


def test_a_vocabulary_smaller_than_the_corpus_ids_is_refused_naming_both(tmp_path):
    small = config(tmp_path, 8, tokenizer=IdentifiedTokenizer.null(100))  # ids up to 1000
    train = build(small)[0]
    with pytest.raises(TokenRangeError, match=r"\.bin: sample 0 of the train split holds token"):
        train[0]
    with pytest.raises(TokenRangeError, match=r"vocab_size is 101 \(ids 0 to 100, its EOD"):
        train.__getitems__([0, 1])
    assert len(build(config(tmp_path, 8))[0][0]["tokens"]) == 8  # a vocabulary that holds them
    # mega preprocess's manifest names the vocabulary the corpus was made with: one larger than
    # the tokenizer's keeps the check; one within it (its ids all below) spares every sample it
    corpus = small.blend[0][0]
    write_manifest(corpus, {"tokenizer": {"vocab_size": 1001}})
    with pytest.raises(TokenRangeError):
        build(small)[0][0]
    write_manifest(corpus, {"tokenizer": {"vocab_size": 101}})
    assert build(small)[0][0]["tokens"].max() > 100  # trusted, as the manifest says


def test_a_blend_with_one_weight_per_prefix_missing_names_both_counts(tmp_path):
    corpus = config(tmp_path, 8).blend[0][0]
    with pytest.raises(ConfigError, match="blend has 2 prefixes but 1 weights"):
        build(config(tmp_path, 8, blend=([corpus, corpus], [1.0])))


def test_budget_counts_take_numpy_integers_and_refuse_booleans():
    assert get_train_valid_test_num_samples(
        4, train_iters=numpy.int64(5), eval_interval=2, eval_iters=1
    ) == get_train_valid_test_num_samples(4, train_iters=5, eval_interval=2, eval_iters=1)
    with pytest.raises(ConfigError, match="train_iters must be an integer >= 0, got True"):
        get_train_valid_test_num_samples(4, train_iters=True)

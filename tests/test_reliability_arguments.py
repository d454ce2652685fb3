"""Reliability: bad arguments of every ``mega`` command stop before any work, naming the
argument, the value and what is allowed; index tables too large for the machine are refused
before they are allocated, naming the settings that size them."""

from __future__ import annotations

import pytest

from megafmt.cli.main import main
from megafmt.testing import write_corpus
from megaindex import (
    BlendedMegatronDatasetBuilder,
    GPTDataset,
    GPTDatasetConfig,
    IndexBuildError,
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
    return GPTDatasetConfig(
        random_seed=1234,
        sequence_length=sequence_length,
        blend=([corpus], None),
        split="90,8,2",
        tokenizer=IdentifiedTokenizer.null(1000),
        path_to_cache=str(tmp_path / "cache"),
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
        **overrides,
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

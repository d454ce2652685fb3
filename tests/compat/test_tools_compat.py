"""Megatron-LM's tools/ at the seed commit against mega's commands that take their flags."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from megafmt.cli.main import main
from megafmt.testing import write_corpus

pytestmark = pytest.mark.compat

VOCAB = 1000
#: Megatron's tokenizer flags for its NullTokenizer (ids written as text, EOD = VOCAB - 1)
NULL_TOKENIZER = ["--tokenizer-type", "NullTokenizer", "--vocab-size", str(VOCAB)]


def test_mega_sequences_writes_build_sequences_per_dataset_s_json(seed, tmp_path: Path) -> None:
    prefixes = [
        write_corpus(str(tmp_path / name), documents, seed=index)
        for index, (name, documents) in enumerate((("web", 40), ("code", 7), ("books", 1)))
    ]
    per_split = tmp_path / "per_split.json"
    per_split.write_text(
        json.dumps({"train": ["0.7", prefixes[0], "0.3", prefixes[1]], "valid": [prefixes[2]],
                    "test": [prefixes[1]]})
    )  # fmt: skip
    forms = [
        {"data_path": ["0.5", prefixes[0], "0.5", prefixes[2]]},
        {"train_data_path": [prefixes[1], prefixes[0]], "valid_data_path": [prefixes[2]],
         "test_data_path": [prefixes[0]]},
        {"per_split_data_args_path": str(per_split)},
    ]  # fmt: skip
    for number, form in enumerate(forms):
        arguments = {
            "data_path": None, "train_data_path": None, "valid_data_path": None,
            "test_data_path": None, "data_args_path": None, "per_split_data_args_path": None,
            **form,
        }  # fmt: skip
        reference = seed.call("seed_tools:sequences_per_dataset", arguments)
        output = tmp_path / f"sequences-{number}.json"
        flags = [f"--{key.replace('_', '-')}" for key in form]
        command = ["sequences", "--per-dataset-sequences-path", str(output)]
        for flag, value in zip(flags, form.values(), strict=True):
            command += [flag, *(value if isinstance(value, list) else [value])]
        assert main(command) == 0
        # the tool json.dumps its dict: the same text, key order included
        assert output.read_text() == json.dumps(reference), form


def test_mega_merge_with_merge_datasets_flags_writes_the_tool_s_bytes(seed, tmp_path: Path) -> None:
    parts = tmp_path / "parts"
    parts.mkdir()
    for index, documents in enumerate((30, 1, 12)):
        write_corpus(str(parts / f"part-{index:02d}"), documents, seed=index, longest=90)
    theirs, ours = str(tmp_path / "theirs"), str(tmp_path / "ours")
    seed.call("seed_tools:merge_datasets", str(parts), theirs)
    assert main(["merge", "--input", str(parts), "--output-prefix", ours]) == 0
    for suffix in (".bin", ".idx"):
        assert Path(ours + suffix).read_bytes() == Path(theirs + suffix).read_bytes(), suffix


def preprocessed_folder(directory: Path) -> list[str]:
    """Two corpora ``mega preprocess`` writes into ``directory`` (with whatever it writes
    beside them); their prefixes."""
    directory.mkdir()
    source = directory.parent / "input.jsonl"
    rows = [
        {"text": " ".join(str((7 * n + k) % 900) for k in range(n % 13 + 1))} for n in range(60)
    ]
    source.write_text("".join(json.dumps(row) + "\n" for row in rows))
    for name in ("web", "code"):
        output = str(directory / name)
        command = ["preprocess", "--input", str(source), "--output-prefix", output]
        assert main([*command, *NULL_TOKENIZER, "--append-eod", "--workers", "1"]) == 0
    return sorted(str(directory / f"{name}_text_document") for name in ("web", "code"))


def test_the_seed_s_tools_run_on_a_folder_mega_preprocess_wrote(seed, tmp_path: Path) -> None:
    """merge_datasets.py takes every file of its folder for half of a pair: nothing mega
    preprocess writes there may trip it, nor prepare_cache.py or
    build_sequences_per_dataset.py, and each gives what mega's command gives."""
    prefixes = preprocessed_folder(tmp_path / "corpus")
    theirs, ours = str(tmp_path / "theirs"), str(tmp_path / "ours")
    seed.call("seed_tools:merge_datasets", str(tmp_path / "corpus"), theirs)
    assert main(["merge", "--input", str(tmp_path / "corpus"), "--output-prefix", ours]) == 0
    for suffix in (".bin", ".idx"):
        assert Path(ours + suffix).read_bytes() == Path(theirs + suffix).read_bytes(), suffix
    arguments = {
        "data_path": ["0.6", prefixes[0], "0.4", prefixes[1]], "train_data_path": None,
        "valid_data_path": None, "test_data_path": None, "data_args_path": None,
        "per_split_data_args_path": None,
    }  # fmt: skip
    reference = seed.call("seed_tools:sequences_per_dataset", arguments)
    sequences = tmp_path / "sequences.json"
    command = ["sequences", "--per-dataset-sequences-path", str(sequences), "--data-path"]
    assert main([*command, *arguments["data_path"]]) == 0
    assert sequences.read_text() == json.dumps(reference)
    cache = tmp_path / "cache"
    flags = [
        "--data-path", *arguments["data_path"], "--split", "90,8,2", "--seq-length", "16",
        "--micro-batch-size", "2", "--train-iters", "10", "--eval-interval", "5",
        "--eval-iters", "1",
        "--data-cache-path", str(cache), "--per-dataset-sequences-path", str(sequences),
        "--num-layers", "2", "--hidden-size", "8", "--num-attention-heads", "2",
        "--max-position-embeddings", "16", *NULL_TOKENIZER,
    ]  # fmt: skip
    _, summary = seed.call("seed_names:prepare_cache", flags)
    assert summary["train_dataset_length"] >= 20
    assert any(cache.glob("*-GPTDataset-train-description.txt"))

"""`mega demo` with megafmt alone: the format's stages run on the default corpora, and the tour
names what to install for the rest (tests/test_demo.py runs the whole tour)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy
import pytest

from megafmt import IndexedDataset
from megafmt.cli.main import main
from megafmt.demo import STAGES

pytestmark = pytest.mark.skipif(
    "index" in STAGES, reason="megaindex is installed: tests/test_demo.py tours every stage"
)


def test_the_format_tour_runs_alone_and_names_the_missing_stages(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    summary_path = tmp_path / "summary.json"
    folder = tmp_path / "demo"
    status = main(
        ["demo", "--size", "small", "--output", str(folder), "--summary", str(summary_path)]
    )
    out = capsys.readouterr().out
    assert status == 0
    summary = json.loads(summary_path.read_text())
    assert list(summary["seconds"]) == ["corpora", "tokenizer", "preprocess", "decode"]
    assert summary["checks"] == {"decoded sample is corpus text": True}
    for stage, package in (
        ("index", "megaindex"),
        ("loader", "megaload"),
        ("get_batch", "megadist"),
    ):
        hint = f"not installed: the {stage} stage: it is provided by {package}: pip install"
        assert f"{hint} ./packages/{package}" in out
    # the corpora are real: as many documents as the jsonl lines, every one ending in EOD
    for name in ("topics", "docstrings"):
        lines = (folder / f"{name}.jsonl").read_text().splitlines()
        corpus = IndexedDataset(str(folder / f"{name}_text_document"))
        assert len(corpus) == len(lines) > 100
        assert summary["facts"][f"corpus {name} (documents / tokens)"] == [
            len(lines),
            int(numpy.asarray(corpus.sequence_lengths).sum()),
        ]
        assert all(int(corpus[i][-1]) == 0 for i in range(0, len(corpus), 50))


def test_user_corpora_need_their_tokenizer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status = main(["demo", "--output", str(tmp_path), "--data-path", "1", str(tmp_path / "x")])
    assert status == 1
    assert "--data-path: give the tokenizer the corpora were made with" in capsys.readouterr().err


def test_a_data_path_of_odd_length_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status = main([
        "demo", "--output", str(tmp_path), "--data-path", "0.5", "a", "0.5",
        "--tokenizer-type", "NullTokenizer", "--vocab-size", "100",
    ])  # fmt: skip
    assert status == 1
    assert "--data-path has an odd number of items (3)" in capsys.readouterr().err


def test_the_tour_takes_the_users_jsonl(tmp_path: Path) -> None:
    """``--input``: the user's jsonl files are the corpora; with no tokenizer given one is
    trained on them, and the decoded document is found in their text."""
    inputs = []
    for name, words in (("animals", "cat dog horse"), ("colours", "red green blue")):
        path = tmp_path / f"{name}.jsonl"
        path.write_text(
            "".join(json.dumps({"text": f"{i} {words} " * (1 + i % 5)}) + "\n" for i in range(60))
        )
        inputs.append(str(path))
    summary_path = tmp_path / "summary.json"
    folder = tmp_path / "demo"
    status = main(
        ["demo", "--size", "small", "--output", str(folder), "--summary", str(summary_path),
         "--input", *inputs, "--vocab-size", "300"]
    )  # fmt: skip
    assert status == 0
    summary = json.loads(summary_path.read_text())
    assert summary["checks"] == {"decoded sample is corpus text": True}
    assert summary["facts"]["corpus animals (documents / tokens)"][0] == 60
    assert summary["facts"]["corpus colours (documents / tokens)"][0] == 60
    assert len(IndexedDataset(str(folder / "colours_text_document"))) == 60

"""`mega demo` at its small size, with all four packages installed: every stage runs and the
summary's checks and figures hold."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

MEGA = str(Path(sys.executable).parent / "mega")


def tour(tmp_path: Path, *flags: str) -> dict:
    summary_path = tmp_path / "summary.json"
    subprocess.run(
        [MEGA, "demo", "--size", "small", "--output", str(tmp_path / "demo"),
         "--summary", str(summary_path), *flags],
        check=True,
        timeout=600,
    )  # fmt: skip
    return json.loads(summary_path.read_text())


def test_the_demo_tours_every_stage_and_its_checks_hold(tmp_path: Path) -> None:
    summary = tour(tmp_path)
    facts = summary["facts"]
    assert facts["samples (train / valid / test)"] == [400, 40, 20]
    assert facts["blend weights asked"] == pytest.approx([0.6, 0.4])
    for asked, realised in zip(
        facts["blend weights asked"], facts["blend weights realised"], strict=True
    ):
        assert abs(asked - realised) < 0.05
    assert facts["samples read (all ranks)"] == 2 * 12 * 4
    assert facts["index tables (train / valid / test)"] == ["built"] * 3
    assert summary["checks"] == {
        "resume gave the same samples": True,
        "get_batch: every rank's share right": True,
        "decoded sample is corpus text": True,
    }
    for name in ("topics", "docstrings"):
        documents, tokens = facts[f"corpus {name} (documents / tokens)"]
        assert documents > 100 and tokens > 10_000
    assert summary["plot"] is None or Path(summary["plot"]).is_file()
    assert list(summary["seconds"]) == [
        "corpora", "tokenizer", "preprocess", "index", "loader", "get_batch", "decode",
    ]  # fmt: skip


def test_the_demo_tours_a_users_own_corpora(tmp_path: Path) -> None:
    """The first tour's corpora and tokenizer given back as a user's --data-path: the same
    splits, read from the cache the first tour built (the names are the same)."""
    tour(tmp_path)
    made = tmp_path / "demo"
    summary = tour(
        tmp_path,
        "--data-path", "0.6", str(made / "topics_text_document"),
        "0.4", str(made / "docstrings_text_document"),
        "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", str(made / "tokenizer"),
    )  # fmt: skip
    assert list(summary["seconds"]) == [
        "corpora", "tokenizer", "preprocess", "index", "loader", "get_batch", "decode",
    ]  # fmt: skip
    assert summary["facts"]["samples (train / valid / test)"] == [400, 40, 20]
    assert summary["facts"]["index tables (train / valid / test)"] == ["cache"] * 3
    assert summary["checks"] == {
        "resume gave the same samples": True,
        "get_batch: every rank's share right": True,
    }  # no text to look a decoded sample up in

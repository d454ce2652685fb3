"""`mega demo` at its small size, with all four packages installed: every stage runs and the
summary's checks and figures hold."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

MEGA = str(Path(sys.executable).parent / "mega")


def tour(folder: Path, *flags: str) -> dict:
    summary_path = folder / "summary.json"
    subprocess.run(
        [MEGA, "demo", "--size", "small", "--output", str(folder / "demo"),
         "--summary", str(summary_path), *flags],
        check=True,
        timeout=600,
    )  # fmt: skip
    return json.loads(summary_path.read_text())


@pytest.fixture(scope="module")
def default_tour(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """The tour on its default corpora (one run shared by the tests of this module)."""
    folder = tmp_path_factory.mktemp("tour")
    return folder, tour(folder)


def test_the_demo_tours_every_stage_and_its_checks_hold(default_tour: tuple[Path, dict]) -> None:
    _, summary = default_tour
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
        "every rank read the micro-batches asked": True,
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


def test_the_demo_tours_a_users_own_corpora(default_tour: tuple[Path, dict]) -> None:
    """The first tour's corpora and tokenizer given back as a user's --data-path: the same
    splits, read from the cache the first tour built (the names are the same)."""
    folder, _ = default_tour
    made = folder / "demo"
    summary = tour(
        folder,
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
        "every rank read the micro-batches asked": True,
        "resume gave the same samples": True,
        "get_batch: every rank's share right": True,
    }  # no text to look a decoded sample up in


def test_the_demo_tours_one_corpus_without_a_blend(
    default_tour: tuple[Path, dict], tmp_path: Path
) -> None:
    """One prefix, no weight, the null tokenizer, no worker processes: a GPTDataset alone (its
    samples carry no dataset_id), and nothing to decode."""
    folder, _ = default_tour
    summary = tour(
        tmp_path,
        "--data-path", str(folder / "demo" / "topics_text_document"),
        "--tokenizer-type", "NullTokenizer", "--vocab-size", "2000", "--num-workers", "0",
    )  # fmt: skip
    facts = summary["facts"]
    assert "blend weights realised" not in facts
    assert facts["samples read (all ranks)"] == 2 * 12 * 4
    assert summary["checks"] == {
        "every rank read the micro-batches asked": True,
        "resume gave the same samples": True,
        "get_batch: every rank's share right": True,
    }


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--seq-length", "66"], "--seq-length 66: get_batch cuts each sequence into 2 x CP = 4"),
        (["--split", "0,100,0"], "--split 0,100,0: the tour reads the training split"),
        (["--steps", "1"], "--steps 1: the tour stops a loader half-way and resumes it"),
    ],
)
def test_settings_a_stage_cannot_work_with_stop_the_tour_first(
    tmp_path: Path, flags: list[str], message: str
) -> None:
    done = subprocess.run(
        [MEGA, "demo", "--size", "small", "--output", str(tmp_path), *flags],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    assert message in done.stderr
    assert not (tmp_path / "topics.jsonl").exists()  # before any stage worked

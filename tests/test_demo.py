"""The demo `make demo` runs, at its small size: every stage runs and its summary holds."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_demo_tours_every_stage_and_its_checks_hold(tmp_path: Path) -> None:
    summary_path = tmp_path / "summary.json"
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "tools" / "demo.py"),
            "--size",
            "small",
            "--output",
            str(tmp_path / "demo"),
            "--summary",
            str(summary_path),
        ],
        check=True,
        timeout=600,
    )
    summary = json.loads(summary_path.read_text())
    assert summary["samples"] == {"train": 400, "valid": 40, "test": 20}
    for asked, realised in zip(summary["weights"], summary["realised_weights"], strict=True):
        assert abs(asked - realised) < 0.05
    assert summary["resume_identical"] is True
    assert summary["get_batch_ranks_right"] is True
    assert summary["decoded_found_in_corpus"] is True
    assert all(corpus["tokens"] > 10_000 for corpus in summary["corpora"].values())
    assert summary["plot"] is None or Path(summary["plot"]).is_file()
    assert set(summary["seconds"]) == {
        "corpora",
        "tokenizer",
        "preprocess",
        "index",
        "loader",
        "get_batch",
        "decode",
    }

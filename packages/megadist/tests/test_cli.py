"""``mega dist demo``: the layout a user sees, checked against the zigzag and THD rules by hand."""

from __future__ import annotations

import pytest

from megafmt.cli.main import main

pytestmark = pytest.mark.distributed


def test_demo_tp2_cp2_prints_every_rank_and_its_zigzag_share(capsys: pytest.CaptureFixture) -> None:
    assert main(["dist", "demo", "--tp", "2", "--cp", "2", "--show", "4"]) == 0
    out = capsys.readouterr().out
    assert "4 ranks (tp 2 x cp 2 x dp 1 x pp 1, gloo)" in out
    ranks = out.split("\nrank ")[1:]
    assert [r.split(":")[0] for r in ranks] == ["0", "1", "2", "3"]
    assert ranks[2].startswith("2: tp 0/2 cp 1/2 dp 0/1 pp 0/1 (single), reads the loader")
    assert ranks[3].startswith("3: tp 1/2 cp 1/2 dp 0/1 pp 0/1 (single), receives")
    # sequence 16 in 4 chunks of 4: CP rank 0 keeps chunks 0 and 3, CP rank 1 chunks 1 and 2
    for rank, first in (
        (0, "0 1 2 3 ..."),
        (1, "0 1 2 3 ..."),
        (2, "4 5 6 7 ..."),
        (3, "4 5 6 7 ..."),
    ):
        assert f"tokens             [2, 8]           int64    {first}" in ranks[rank]
    assert "dataset_id" not in out


def test_demo_with_packed_documents_splits_each_document(capsys: pytest.CaptureFixture) -> None:
    assert main(["dist", "demo", "--tp", "1", "--cp", "2", "--packed", "8,4,4"]) == 0
    ranks = capsys.readouterr().out.split("\nrank ")[1:]
    # documents [0, 8), [8, 12), [12, 16) cut in 4 chunks each; CP rank 0 keeps chunks 0 and 3
    assert "tokens             [1, 8]           int64    0 1 6 7 8 11 12 15" in ranks[0]
    assert "tokens             [1, 8]           int64    2 3 4 5 9 10 13 14" in ranks[1]
    assert "cu_seqlens         [1, 4]           int32    0 8 12 16" in ranks[1]


def test_demo_pipeline_stages_hold_their_keys(capsys: pytest.CaptureFixture) -> None:
    assert main(["dist", "demo", "--tp", "1", "--pp", "2", "--attention-mask"]) == 0
    first, last = capsys.readouterr().out.split("\nrank ")[1:]
    assert "(first)" in first and "labels             None" in first
    assert "attention_mask     [2, 1, 16, 16]   bool" in first
    assert "(last)" in last and "tokens             None" in last
    assert "labels             [2, 16]          int64    1 2 3 4 5 6 7 8 ..." in last

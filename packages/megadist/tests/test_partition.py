"""The context-parallel splits, against hand-worked examples and the documented rules."""

from __future__ import annotations

import pytest
import torch

from megadist import (
    CP_PARTITIONERS,
    PartitionError,
    thd_partitioned_indices,
    thd_split,
    zigzag_split,
)
from megafmt import PluginError


def row(length: int, rows: int = 1) -> torch.Tensor:
    return torch.arange(rows * length).reshape(rows, length)


def test_zigzag_cp2_gives_rank0_chunks_0_and_3_and_rank1_chunks_1_and_2() -> None:
    batch = {"tokens": row(8, rows=2)}
    assert zigzag_split(batch, 0, 2)["tokens"].tolist() == [[0, 1, 6, 7], [8, 9, 14, 15]]
    assert zigzag_split(batch, 1, 2)["tokens"].tolist() == [[2, 3, 4, 5], [10, 11, 12, 13]]


def test_zigzag_cp4_pairs_first_and_last_chunks() -> None:
    tokens = row(16)
    shares = [zigzag_split({"tokens": tokens}, r, 4)["tokens"][0].tolist() for r in range(4)]
    assert shares == [[0, 1, 14, 15], [2, 3, 12, 13], [4, 5, 10, 11], [6, 7, 8, 9]]


def test_zigzag_splits_the_attention_mask_on_dimension_2_only() -> None:
    mask = torch.arange(2 * 1 * 8 * 8).reshape(2, 1, 8, 8)
    share = zigzag_split({"attention_mask": mask}, 1, 2)["attention_mask"]
    assert share.shape == (2, 1, 4, 8)
    assert torch.equal(share, mask[:, :, [2, 3, 4, 5], :])


def test_zigzag_leaves_metadata_none_and_non_tensors_alone_and_copies_the_dict() -> None:
    cu = torch.tensor([[0, 4, 8]], dtype=torch.int32)
    batch = {"tokens": row(8), "cu_seqlens": cu, "labels": None, "name": "x", "max_seqlen": 4}
    share = zigzag_split(batch, 0, 2)
    assert share["cu_seqlens"] is cu and share["labels"] is None and share["name"] == "x"
    assert share["max_seqlen"] == 4
    assert batch["tokens"].shape == (1, 8)  # the input is not modified


def test_zigzag_with_cp1_is_the_identity() -> None:
    tokens = row(6)
    assert zigzag_split({"tokens": tokens}, 0, 1)["tokens"] is tokens


@pytest.mark.parametrize(
    ("batch", "match"),
    [
        ({"tokens": row(6)}, "sequence length 6 .* not divisible by 2 x cp_size = 4"),
        ({"dataset_id": torch.arange(3)}, "'dataset_id' has shape \\[3\\]: no sequence dimension"),
    ],
)
def test_zigzag_refuses_what_it_cannot_split(batch: dict, match: str) -> None:
    with pytest.raises(PartitionError, match=match):
        zigzag_split(batch, 0, 2)


def test_zigzag_refuses_a_rank_outside_the_group() -> None:
    with pytest.raises(PartitionError, match="CP rank 2 is outside a CP group of size 2"):
        zigzag_split({"tokens": row(8)}, 2, 2)


def test_thd_indices_split_each_sequence_on_its_own() -> None:
    # sequences [0, 8), [8, 12), [12, 16) at cp 2: chunks of 2, 1 and 1 tokens
    cu = torch.tensor([0, 8, 12, 16], dtype=torch.int32)
    rank0 = thd_partitioned_indices(cu, 16, 2, 0)
    rank1 = thd_partitioned_indices(cu, 16, 2, 1)
    assert rank0.dtype == torch.int32
    assert rank0.tolist() == [0, 1, 6, 7, 8, 11, 12, 15]
    assert rank1.tolist() == [2, 3, 4, 5, 9, 10, 13, 14]


def test_thd_indices_cover_every_token_once_at_cp4() -> None:
    cu = torch.tensor([0, 16, 24, 64], dtype=torch.int32)
    shares = [thd_partitioned_indices(cu, 64, 4, r).tolist() for r in range(4)]
    assert sorted(i for share in shares for i in share) == list(range(64))
    # rank 1 of the first sequence (chunks of 2): chunks 1 and 6
    assert shares[1][:4] == [2, 3, 12, 13]


def test_thd_indices_past_the_last_boundary_continue_the_last_chunk_like_te() -> None:
    # TransformerEngine's kernel: local token 4 of rank 0 lies past the single sequence of 8,
    # so it continues that sequence's second chunk (positions 6, 7) into 8, 9
    cu = torch.tensor([0, 8], dtype=torch.int32)
    assert thd_partitioned_indices(cu, 12, 2, 0).tolist() == [0, 1, 6, 7, 8, 9]


@pytest.mark.parametrize(
    ("cu", "total", "match"),
    [
        ([0, 6, 16], 16, "cu_seqlens\\[1\\] = 6 is not a multiple of 2 x cp_size = 4"),
        ([0], 16, "at least 2 entries"),
        ([0, 8], 10, "total_tokens 10 is not divisible by cp_size 4"),
    ],
)
def test_thd_indices_refuse_bad_boundaries(cu: list[int], total: int, match: str) -> None:
    with pytest.raises(PartitionError, match=match):
        thd_partitioned_indices(
            torch.tensor(cu, dtype=torch.int32), total, 4 if total == 10 else 2, 0
        )


def test_thd_split_uses_the_padded_boundaries_and_keeps_metadata_whole() -> None:
    tokens = row(16)
    batch = {
        "tokens": tokens,
        "labels": tokens + 100,
        "cu_seqlens": torch.tensor([[0, 7, 12, 16]], dtype=torch.int32),  # not multiples of 4
        "cu_seqlens_padded": torch.tensor([[0, 8, 12, 16]], dtype=torch.int32),
        "max_seqlen": torch.tensor([8], dtype=torch.int32),
        "attention_mask": None,
    }
    share = thd_split(batch, 1, 2)
    assert share["tokens"].tolist() == [[2, 3, 4, 5, 9, 10, 13, 14]]
    assert share["labels"].tolist() == [[102, 103, 104, 105, 109, 110, 113, 114]]
    for key in ("cu_seqlens", "cu_seqlens_padded", "max_seqlen"):
        assert share[key] is batch[key]


def test_thd_split_refuses_boundaries_that_stop_short_of_the_row() -> None:
    batch = {"tokens": row(16), "cu_seqlens": torch.tensor([[0, 8]], dtype=torch.int32)}
    with pytest.raises(PartitionError, match="end at 8 but the row has 16 tokens"):
        thd_split(batch, 0, 2)


def test_thd_split_needs_boundaries() -> None:
    with pytest.raises(PartitionError, match="needs 'cu_seqlens'"):
        thd_split({"tokens": row(8)}, 0, 2)


def test_the_partitioners_are_entry_point_plugins() -> None:
    assert {"zigzag", "thd"} <= set(CP_PARTITIONERS.available())
    assert CP_PARTITIONERS.get("zigzag") is zigzag_split
    assert CP_PARTITIONERS.get("thd") is thd_split
    with pytest.raises(PluginError, match="unknown context-parallel partitioner 'zigzg'.*'zigzag'"):
        CP_PARTITIONERS.get("zigzg")

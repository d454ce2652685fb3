"""Fixtures shared by megadist's tests."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="session")
def megatron_dtypes() -> dict[str, torch.dtype]:
    """The dtypes of Megatron-LM's receive buffers in get_batch_on_this_tp_rank, listed by hand."""
    return {
        "tokens": torch.int64,
        "labels": torch.int64,
        "loss_mask": torch.float32,
        "attention_mask": torch.bool,
        "position_ids": torch.int64,
        "cu_seqlens": torch.int32,
        "cu_seqlens_padded": torch.int32,
        "max_seqlen": torch.int32,
        "local_cp_size": torch.int32,
    }

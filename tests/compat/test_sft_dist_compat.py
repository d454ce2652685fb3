"""An SFT batch through the whole path on TP=2 x CP=2 gloo ranks, against the seed commit.

The SFTDataset's packed samples go through megaload's loader (micro-batch 1, as Megatron-LM's
--sft runs) and megadist's get_batch (the variable-length cu_seqlens broadcast, the THD split
across CP ranks); every rank's share must equal what pretrain_gpt.py's get_batch gives it with
the seed commit's get_batch_on_this_tp_rank and get_batch_on_this_cp_rank on the same batches,
run in four seed workers over gloo.

The THD rule compared against: TransformerEngine is not installable here, so the seed's
``tex.thd_get_partitioned_indices`` is a stand-in (tests/compat/seedside/seed_sft_dist.py) that
keeps chunks r and 2cp-1-r of each sequence cut into 2cp chunks: the rule of TransformerEngine's
``thd_partition_indices_kernel`` (transformer_engine/common/fused_attn/context_parallel.cu), for
rows the packed sequences fill exactly, as SFT packs always do.
"""

from __future__ import annotations

from pathlib import Path

import numpy
import pytest
from seedref import SeedProcess, call_on_ranks
from torch.utils.data import default_collate

from megadist import build_parallel_groups, get_batch
from megadist.spawn import run_distributed
from megafmt.sft import SFTTokenizer
from megafmt.sft.testing import write_sft_jsonl, write_sft_tokenizer
from megaindex import BlendedMegatronDatasetBuilder, SFTDatasetConfig
from megaload import DataLoaderConfig, build_pretraining_data_loader

pytestmark = [pytest.mark.compat, pytest.mark.distributed]

SEEDSIDE = Path(__file__).parent / "seedside"
TP, CP, SEQ, STEPS = 2, 2, 96, 6


def sft_batches(tmp_path: Path) -> list[dict]:
    """STEPS micro-batches of SFT samples (CP-padded packs, some cut) from megaload's loader."""
    tokenizer = SFTTokenizer(str(write_sft_tokenizer(tmp_path / "tokenizer")))
    path = str(tmp_path / "chat.jsonl")
    write_sft_jsonl(path, 20, seed=4, conversations=3)
    config = SFTDatasetConfig(
        random_seed=7,
        sequence_length=SEQ,
        blend=([path], None),
        split="100,0,0",
        tokenizer=tokenizer,
        context_parallel_size=CP,
    )
    train, _, _ = BlendedMegatronDatasetBuilder("sft", [STEPS, 1, 1], lambda: True, config).build()
    loader = build_pretraining_data_loader(
        train, 0, DataLoaderConfig(micro_batch_size=1, global_batch_size=1, num_workers=0)
    )
    batches = [dict(batch) for batch, _ in zip(loader, range(STEPS), strict=False)]
    for step, batch in enumerate(batches):  # what Megatron-LM's loader (default collate) makes
        expected = default_collate([train[step]])
        assert list(batch) == list(expected)
        for key, value in expected.items():
            assert batch[key].dtype == value.dtype and bool((batch[key] == value).all()), key
    return [{k: v.numpy() for k, v in batch.items()} for batch in batches]


def ours_on_rank(batches: list[dict]) -> list[dict]:
    import torch

    layout = build_parallel_groups(tp=TP, cp=CP)
    topology = layout.topology(1, SEQ, packed_sequences=True)
    loader = iter([{k: torch.from_numpy(v) for k, v in b.items()} for b in batches])
    shares = [get_batch(loader if topology.is_source else None, topology) for _ in batches]
    return [
        {k: None if v is None else v.numpy().copy() for k, v in share._asdict().items()}
        for share in shares
    ]


def seed_shares(batches: list[dict]) -> list[list[dict]]:
    workers = [SeedProcess(paths=[SEEDSIDE], timeout=300) for _ in range(TP * CP)]
    try:
        return call_on_ranks(workers, "seed_sft_dist:shares", TP, CP, SEQ, batches)
    finally:
        for worker in workers:
            worker.close()


@pytest.mark.seed
def test_tp2_cp2_sft_shares_equal_the_seed_s_get_batch(tmp_path):
    batches = sft_batches(tmp_path)
    assert any(len(b["cu_seqlens"][0]) > 2 for b in batches)  # several packed conversations
    ours = run_distributed(ours_on_rank, TP * CP, batches, timeout=300)
    theirs = seed_shares(batches)
    keys = ["tokens", "labels", "loss_mask", "position_ids", "cu_seqlens", "max_seqlen"]
    for rank in range(TP * CP):
        for step in range(STEPS):
            mine, expected = ours[rank][step], theirs[rank][step]
            where = f"rank {rank} (tp {rank % TP}, cp {rank // TP}), step {step}"
            assert mine["cu_seqlens_padded"] is None and expected["cu_seqlens_padded"] is None
            assert mine["attention_mask"] is None and expected["attention_mask"] is None
            for key in keys:
                assert mine[key].dtype == expected[key].dtype, (where, key)
                numpy.testing.assert_array_equal(mine[key], expected[key], err_msg=f"{where} {key}")
            assert mine["tokens"].shape == (1, SEQ // CP)

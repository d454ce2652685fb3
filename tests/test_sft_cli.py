"""SFT across packages with a real (tiny, trained here) tokenizer: mega index explain on an SFT
pack, and SFT batches through megaload's loader with worker processes."""

from __future__ import annotations

import json

import torch

from megafmt.cli.main import main
from megafmt.sft import SFTTokenizer
from megafmt.sft.testing import write_sft_jsonl, write_sft_tokenizer
from megaindex import BlendedMegatronDatasetBuilder, SFTDatasetConfig
from megaload import DataLoaderConfig, build_pretraining_data_loader


def test_explain_shows_an_sft_pack_with_its_segments_and_loss_decoded(tmp_path, capsys):
    tokenizer = str(write_sft_tokenizer(tmp_path / "tokenizer"))
    path = str(tmp_path / "chat.jsonl")
    write_sft_jsonl(path, 12, seed=1, conversations=3)
    args = ["--dataset", "sft", "--data-path", path, "--seq-length", "64", "--split", "100,0,0"]
    args += ["--sft-tokenizer", tokenizer, "--samples", "20", "--context-parallel-size", "2"]
    # one replica of CP 2; SFT packs take no attention mask (Megatron asserts so too)
    args += ["--prepare-cache-world-size", "2", "--no-create-attention-mask-in-dataloader"]
    assert main(["index", "explain", *args, "--sample", "13"]) == 0
    shown = capsys.readouterr().out.splitlines()
    assert (
        shown[0].startswith("train sample 13 packs line 1 of ")
        and "(line 2 of the file)" in shown[0]
    )
    bounds = json.loads(shown[0].split("cu_seqlens ")[1].split(", max_seqlen")[0])
    assert bounds[0] == 0 and bounds[-1] == 64 and all(b % 4 == 0 for b in bounds)
    segments = [line for line in shown if line.startswith("  segment ")]
    assert len(segments) == len(bounds) - 1
    assert segments[0].startswith(f"  segment 0 [0, {bounds[1]}): {bounds[1]} tokens")
    runs = [line.split()[0] for line in shown if line.startswith("    ")]
    assert runs[0] == "prompt" and "loss" in runs
    assert any("'<SPECIAL_10>System\\n" in line for line in shown)  # decoded


def test_sft_batches_through_loader_workers_equal_the_samples(tmp_path):
    tokenizer = SFTTokenizer(str(write_sft_tokenizer(tmp_path / "tokenizer")), "nemotron-nano-v2")
    path = str(tmp_path / "chat.jsonl")
    write_sft_jsonl(path, 16, seed=2)
    config = SFTDatasetConfig(
        random_seed=3,
        sequence_length=48,
        blend=([path], None),
        split="100,0,0",
        tokenizer=tokenizer,
    )
    train, _, _ = BlendedMegatronDatasetBuilder(
        "sft", [8, None, None], lambda: True, config
    ).build()
    loader = build_pretraining_data_loader(
        train, 0, DataLoaderConfig(micro_batch_size=1, global_batch_size=1, num_workers=2)
    )
    batches = list(loader)
    assert len(batches) == 8
    for idx, batch in enumerate(batches):
        for key, value in train[idx].items():
            assert torch.equal(batch[key][0], value), (idx, key)

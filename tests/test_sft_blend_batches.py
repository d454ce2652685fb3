"""A blend of SFT corpora through megaload's loader at micro-batch 4 (issue 31): each batch is
the blend's samples read one by one, ``cu_seqlens`` padded to the batch's longest with its last
boundary (torch's default collation, the old per-sample fallback, failed here: "stack expects
each tensor to be equal size")."""

from __future__ import annotations

import pytest
import torch

from megafmt.sft import SFTTokenizer
from megafmt.sft.testing import write_sft_jsonl, write_sft_tokenizer
from megaindex import BlendedDataset, BlendedMegatronDatasetBuilder, SFTDatasetConfig
from megaload import DataLoaderConfig, build_pretraining_data_loader


@pytest.mark.filterwarnings("ignore:SFT sample")
@pytest.mark.parametrize("workers", [0, 2])
def test_a_blend_of_sft_corpora_batches_at_micro_batch_4(tmp_path, workers):
    tokenizer = SFTTokenizer(str(write_sft_tokenizer(tmp_path / "tokenizer")), "nemotron-nano-v2")
    paths = []
    for number, conversations in enumerate((1, 3, 2)):  # packs of different segment counts
        path = str(tmp_path / f"chat{number}.jsonl")
        write_sft_jsonl(path, 12, seed=number, conversations=conversations)
        paths.append(path)
    config = SFTDatasetConfig(
        random_seed=3,
        sequence_length=64,
        blend=(paths, [0.5, 0.3, 0.2]),
        split="100,0,0",
        tokenizer=tokenizer,
    )
    blend = BlendedMegatronDatasetBuilder("sft", [24, 0, 0], lambda: True, config).build()[0]
    assert isinstance(blend, BlendedDataset) and len(set(blend.dataset_index.tolist())) == 3
    loader = build_pretraining_data_loader(
        blend, 0, DataLoaderConfig(micro_batch_size=4, num_workers=workers, pin_memory=False)
    )
    batches = list(loader)
    assert len(batches) == 6
    segment_counts = set()
    for number, batch in enumerate(batches):
        for row in range(4):
            sample = blend[4 * number + row]
            assert list(batch) == list(sample)
            for key, value in sample.items():
                got = batch[key][row]
                if key == "cu_seqlens":
                    segment_counts.add(len(value))
                    tail = got[len(value) :]
                    assert torch.equal(got[: len(value)], value) and bool((tail == value[-1]).all())
                else:
                    assert torch.equal(got, torch.as_tensor(value)), (number, row, key)
    assert len(segment_counts) > 1  # rows of different cu_seqlens lengths were merged

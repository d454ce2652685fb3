"""Smoke test of the four wheels together, with torch: a GPTDataset sample, a blend of two
corpora, a batch from megaload's loader, megadist's get_batch on a one-rank gloo group and
``mega --version``. Usage: ``python all_packages.py VERSION`` (in a scratch folder)."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
from smoke import EOD, assert_installed, check, expected_version, mega, write_corpus

import megadist
import megafmt
import megaindex
import megaload
from megadist import build_parallel_groups, get_batch
from megaindex import BlendedMegatronDatasetBuilder, GPTDataset, GPTDatasetConfig
from megaindex.tokenizer import IdentifiedTokenizer
from megaload import DataLoaderConfig, build_pretraining_data_loader

SEQUENCE_LENGTH = 32
MICRO_BATCH = 4


def gpt_config(blend: tuple[list[str], list[float] | None]) -> GPTDatasetConfig:
    return GPTDatasetConfig(
        random_seed=1234,
        sequence_length=SEQUENCE_LENGTH,
        blend=blend,
        split="100,0,0",
        tokenizer=IdentifiedTokenizer.null(EOD),
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
        path_to_cache=str(Path("cache").resolve()),
    )


def main() -> None:
    with check(f"the four packages {expected_version()} import from their wheels"):
        for package in (megafmt, megaindex, megaload, megadist):
            assert_installed(package)
            assert package.__version__ == expected_version(), package
    web, code = (str(Path(name).resolve()) for name in ("web", "code"))
    write_corpus(Path(web), seed=1)
    write_corpus(Path(code), seed=2)

    with check("GPTDataset gives a sample (megaindex's C++ extension)"):
        (train, valid, test) = BlendedMegatronDatasetBuilder(
            GPTDataset, [100, None, None], lambda: True, gpt_config(([web], None))
        ).build()
        sample = train[0]
        assert sample["tokens"].shape == (SEQUENCE_LENGTH,) and valid is None and test is None

    with check("BlendedMegatronDatasetBuilder blends two corpora"):
        (blend, _, _) = BlendedMegatronDatasetBuilder(
            GPTDataset, [300, 0, 0], lambda: True, gpt_config(([web, code], [0.7, 0.3]))
        ).build()
        assert len(blend) >= 300
        assert {int(i) for i in blend.dataset_index[:300]} == {0, 1}

    config = DataLoaderConfig(
        micro_batch_size=MICRO_BATCH,
        global_batch_size=MICRO_BATCH,
        data_parallel_rank=0,
        data_parallel_size=1,
        dataloader_type="single",
        num_workers=0,
    )
    with check("megaload's build_pretraining_data_loader yields a batch"):
        batch = next(iter(build_pretraining_data_loader(blend, 0, config)))
        assert batch["tokens"].shape == (MICRO_BATCH, SEQUENCE_LENGTH)

    with check("megadist's get_batch on a one-rank gloo group"):
        rendezvous = Path("rendezvous").resolve()
        dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=0, world_size=1)
        try:
            layout = build_parallel_groups()
            topology = layout.topology(MICRO_BATCH, SEQUENCE_LENGTH, attention_mask=True)
            loader = build_pretraining_data_loader(blend, 0, config)
            distributed = get_batch(iter(loader), topology)
        finally:
            dist.destroy_process_group()
        assert torch.equal(distributed.tokens, batch["tokens"])
        assert distributed.labels.shape == (MICRO_BATCH, SEQUENCE_LENGTH)

    with check("mega --version"):
        assert expected_version() in mega("--version")


if __name__ == "__main__":
    main()

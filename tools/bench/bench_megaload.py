"""DataLoader throughput: megaload over megaindex against Megatron-LM's loader settings over
megatron-core's GPTDataset, in one run.

    .venv/bin/python tools/bench/bench_megaload.py [--batches 200]

Micro-batch 4, sequence length 4096, with 0 and 2 workers, attention masks off and on (the
default flags otherwise). Megatron-LM's side is a torch DataLoader with the sequential batch
sampler, default collation and persistent workers, as its build_pretraining_data_loader makes
it (pin_memory off: no GPU here). Prints samples/s for both and the ratio.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_megaindex

from megaload import DataLoaderConfig, MegatronPretrainingSampler, build_pretraining_data_loader

WORKDIR = bench_megaindex.ROOT / "build" / "bench_megaload"
MICRO_BATCH = 4


def samples_per_second(loader, batches: int) -> float:
    iterator = iter(loader)
    next(iterator)  # worker start-up is not throughput
    start = time.perf_counter()
    for _ in range(batches):
        next(iterator)
    return batches * MICRO_BATCH / (time.perf_counter() - start)


def megatron_loader(dataset, workers: int) -> DataLoader:
    sampler = MegatronPretrainingSampler(len(dataset), 0, MICRO_BATCH, 0, 1)
    return DataLoader(
        dataset,
        batch_sampler=sampler,
        num_workers=workers,
        pin_memory=False,
        persistent_workers=workers > 0,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=200)
    args = parser.parse_args()
    bench_megaindex.quiet_imports()
    shutil.rmtree(WORKDIR, ignore_errors=True)
    WORKDIR.mkdir(parents=True)
    bench_megaindex.WORKDIR = WORKDIR
    prefix = str(WORKDIR / "realistic")
    bench_megaindex.realistic_corpus(prefix)
    size = (args.batches + 2) * MICRO_BATCH
    print(
        f"DataLoader, micro-batch {MICRO_BATCH}, sequence {bench_megaindex.SEQUENCE_LENGTH} "
        "(samples/s)",
        flush=True,
    )
    try:
        for masks in (False, True):
            flags = {"create_attention_mask": masks}
            theirs = bench_megaindex.datasets(
                "megatron", prefix, str(WORKDIR / f"m{masks}"), [size, None, None], **flags
            )[0]
            ours = bench_megaindex.datasets(
                "megaindex", prefix, str(WORKDIR / f"o{masks}"), [size, None, None], **flags
            )[0]
            for workers in (0, 2):
                config = DataLoaderConfig(
                    micro_batch_size=MICRO_BATCH, num_workers=workers, pin_memory=False
                )
                mine = build_pretraining_data_loader(ours, 0, config)
                bench_megaindex.report(
                    f"  {workers} workers, attention mask {'on' if masks else 'off'}",
                    samples_per_second(megatron_loader(theirs, workers), args.batches),
                    samples_per_second(mine, args.batches),
                    "samples/s",
                    True,
                )
    finally:
        shutil.rmtree(WORKDIR, ignore_errors=True)


if __name__ == "__main__":
    main()

"""DataLoader throughput: megaload over megaindex against Megatron-LM's loader settings over
megatron-core's (or the seed commit's) datasets, in one run.

    .venv/bin/python tools/bench/bench_megaload.py [--batches 200]
        [--reference megatron-core|seed] [--rows FILE]

Micro-batch 4, sequence length 4096, with 0 and 2 workers:

* one corpus, attention masks off and on (the default flags otherwise);
* a blend of 3 corpora (weights 0.5, 0.3, 0.2), attention masks off: megatron-core's blend,
  megaload over megaindex's blend, and the blend's samples/s as a share of megaload over one
  corpus measured in the same run.

Megatron-LM's side is a torch DataLoader with the sequential batch sampler, default collation
and persistent workers, as its build_pretraining_data_loader makes it (pin_memory off: no GPU
here). Prints samples/s for both and the ratio.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchreport

REFERENCE = benchreport.enter_reference(("megatron-core", "seed"))
import bench_megaindex  # noqa: E402

from megaload import (  # noqa: E402
    DataLoaderConfig,
    MegatronPretrainingSampler,
    build_pretraining_data_loader,
)

WORKDIR = bench_megaindex.ROOT / "build" / "bench_megaload"
MICRO_BATCH = 4
BLEND_WEIGHTS = [0.5, 0.3, 0.2]


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


def megaload_loader(dataset, workers: int):
    config = DataLoaderConfig(micro_batch_size=MICRO_BATCH, num_workers=workers, pin_memory=False)
    return build_pretraining_data_loader(dataset, 0, config)


def bench_corpus(
    report: benchreport.Report, prefix: str, size: int, batches: int
) -> dict[int, float]:
    """One corpus, masks off and on; returns megaload's samples/s with masks off by workers."""
    single: dict[int, float] = {}
    for masks in (False, True):
        theirs, ours = (
            bench_megaindex.datasets(
                side,
                prefix,
                str(WORKDIR / f"{side}{masks}"),
                [size, None, None],
                create_attention_mask=masks,
            )[0]
            for side in ("megatron", "megaindex")
        )
        for workers in (0, 2):
            mine = samples_per_second(megaload_loader(ours, workers), batches)
            if not masks:
                single[workers] = mine
            report.compare(
                f"DataLoader, one corpus, {workers} workers, attention mask "
                f"{'on' if masks else 'off'}",
                ours=mine,
                theirs=samples_per_second(megatron_loader(theirs, workers), batches),
                unit="samples/s",
                higher_is_better=True,
                conditions=conditions(batches),
            )
    return single


def conditions(batches: int) -> str:
    return (
        f"micro-batch {MICRO_BATCH}, sequence {bench_megaindex.SEQUENCE_LENGTH}, {batches} "
        "batches after the first"
    )


def bench_blend(
    report: benchreport.Report,
    prefixes: list[str],
    size: int,
    batches: int,
    single: dict[int, float],
) -> None:
    """A blend of the corpora, masks off: against the reference's blend and one corpus."""
    blend = (prefixes, BLEND_WEIGHTS)
    theirs, ours = (
        bench_megaindex.datasets(
            side,
            prefixes[0],
            str(WORKDIR / f"{side}-blend"),
            [size, 0, 0],
            blend=blend,
            create_attention_mask=False,
        )[0]
        for side in ("megatron", "megaindex")
    )
    for idx in (0, 1, 7):
        for key, value in theirs[idx].items():
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(ours[idx][key])), key
    weights = "/".join(f"{w:g}" for w in BLEND_WEIGHTS)
    for workers in (0, 2):
        mine = samples_per_second(megaload_loader(ours, workers), batches)
        report.compare(
            f"DataLoader, blend of 3, {workers} workers, attention mask off",
            ours=mine,
            theirs=samples_per_second(megatron_loader(theirs, workers), batches),
            unit="samples/s",
            higher_is_better=True,
            conditions=f"{conditions(batches)}; weights {weights}",
        )
        if workers in single:
            report.note(
                f"blend of 3 as a share of one corpus, {workers} workers: "
                f"{mine / single[workers]:.0%} ({mine:,.0f} vs {single[workers]:,.0f} samples/s)"
            )


def main() -> None:
    parser = benchreport.parser(__doc__)
    parser.add_argument("--batches", type=int, default=200)
    args = parser.parse_args()
    report = benchreport.Report("megaload", REFERENCE, args.rows)
    bench_megaindex.quiet_imports()
    # the reference's BlendedDataset asks torch.distributed for the rank: one process group
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    torch.distributed.init_process_group("gloo", rank=0, world_size=1)
    shutil.rmtree(WORKDIR, ignore_errors=True)
    WORKDIR.mkdir(parents=True)
    prefixes = [str(WORKDIR / f"corpus{seed}") for seed in range(len(BLEND_WEIGHTS))]
    for seed, prefix in enumerate(prefixes):
        bench_megaindex.realistic_corpus(prefix, seed)
    size = (args.batches + 2) * MICRO_BATCH
    report.heading(f"DataLoader: {conditions(args.batches)}")
    try:
        single = bench_corpus(report, prefixes[0], size, args.batches)
        bench_blend(report, prefixes, size, args.batches, single)
    finally:
        shutil.rmtree(WORKDIR, ignore_errors=True)
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()

"""``mega index build``: build the index caches of a job's datasets before it starts, and report
each split's samples, cache key, epochs and the time of each phase.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from megaindex.blended_dataset import BlendedDataset
from megaindex.dataset_flags import build_datasets, build_phases
from megaindex.gpt_dataset import GPTDataset
from megaindex.utils import Split


def run_build(args: argparse.Namespace) -> int:
    start = time.perf_counter()
    for flag in ("dataloader_fast_cache_load", "dataloader_defer_npy_index_mmap"):
        if vars(args)[flag]:  # taken, and set aside as prepare_cache.py does
            print(f"> ignoring --{flag.replace('_', '-')} during cache preparation")
    phases = build_phases(args) if args.phases else [(None, build_datasets(args))]
    for first, datasets in phases:
        if first is not None:
            print(f"phase from iteration {first}:")
        for split, dataset in zip(Split, datasets, strict=True):
            if dataset is not None:
                print(_report_built(split, dataset))
    print(f"done in {time.perf_counter() - start:.2f} s")
    return 0


def _report_built(split: Split, dataset: Any, indent: str = "") -> str:
    if isinstance(dataset, list):  # multiple validation sets
        return "\n".join(_report_built(split, d, indent) for d in dataset)
    if not isinstance(dataset, (GPTDataset, BlendedDataset)):  # a third party's class
        return f"{indent}{split.name:<5} {len(dataset):>12,} samples  {type(dataset).__name__}"
    source = dataset.index_source
    key = source.cache_entry.base if source.cache_entry else "(not cached)"
    what = f"blend of {len(dataset.datasets)}  " if isinstance(dataset, BlendedDataset) else ""
    line = f"{indent}{split.name:<5} {len(dataset):>12,} samples  {what}{source.kind:<6}  {key}"
    if source.seconds:
        phases = ", ".join(f"{name} {seconds:.2f} s" for name, seconds in source.seconds.items())
        line += f"\n{indent}      {phases}"
    if isinstance(dataset, BlendedDataset):
        parts = [line] + [_report_built(split, d, indent + "    ") for d in dataset.datasets]
        return "\n".join(parts)
    plan = dataset.epoch_plan
    line += (
        f"\n{indent}      {plan.num_epochs} epoch(s) of {plan.tokens_per_epoch:,} tokens, "
        f"separate final epoch: {'yes' if plan.separate_final_epoch else 'no'}"
    )
    return line

"""megadist's stage of ``mega demo``: the first micro-batches data-parallel rank 0 read in the
loader stage go through ``get_batch`` on 4 gloo ranks laid out TP=2 x CP=2 (one data-parallel
rank), and every rank's share is checked against the zigzag split of that micro-batch."""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy
import torch

from megadist.get_batch import get_batch
from megadist.layout import build_parallel_groups
from megadist.partition import zigzag_split
from megadist.spawn import run_distributed
from megafmt.demo import DemoRun

#: the layout the tour shows
TP, CP = 2, 2


def held_on_rank(batches: list[dict[str, numpy.ndarray]], seq_length: int) -> dict[str, Any]:
    """One gloo rank: its coordinates, and what get_batch gave it at each step.

    Batches travel to and from the ranks as numpy arrays, pickled by value: tensors would be
    passed as shared-memory handles, which vanish when the rank that made them exits."""
    warnings.simplefilter("ignore")
    layout = build_parallel_groups(tp=TP, cp=CP)
    masked = "attention_mask" in batches[0]
    topology = layout.topology(len(batches[0]["tokens"]), seq_length, attention_mask=masked)
    tensors = [{key: torch.from_numpy(value) for key, value in b.items()} for b in batches]
    source = iter(tensors) if topology.is_source else None
    held = []
    for _ in batches:
        batch = get_batch(source, topology)._asdict()
        held.append({key: value.numpy() for key, value in batch.items() if value is not None})
    return {"where": layout.describe(), "cp_rank": topology.cp_rank, "held": held}


def _matches(held: Mapping[str, numpy.ndarray], expected: Mapping[str, Any]) -> bool:
    """Every key of the micro-batch, with its zigzag share's shape and values."""
    return held.keys() == expected.keys() and all(
        numpy.array_equal(value, numpy.asarray(expected[key])) for key, value in held.items()
    )


class GetBatchStage:
    """get_batch over TP=2 x CP=2 gloo ranks on the tour's real micro-batches."""

    title = "megadist: get_batch on TP=2 x CP=2 gloo ranks"
    order = 60
    needs: Sequence[str] = ("loader",)

    def check(self, run: DemoRun) -> None:
        if run.settings.seq_length % (2 * CP):
            raise ValueError(
                f"--seq-length {run.settings.seq_length}: get_batch cuts each sequence into "
                f"2 x CP = {2 * CP} zigzag chunks on the tour's CP={CP} layout, so it must be a "
                f"multiple of {2 * CP}"
            )

    def run(self, run: DemoRun) -> None:
        batches = [
            {key: numpy.asarray(value) for key, value in batch.items() if key != "dataset_id"}
            for batch in run.batches[0][: run.settings.get_batch_steps]
        ]
        ranks = run_distributed(
            held_on_rank, TP * CP, batches, run.settings.seq_length, timeout=600
        )
        right = True
        for rank, report in enumerate(ranks):
            for step, held in enumerate(report["held"]):
                whole = {key: torch.from_numpy(value) for key, value in batches[step].items()}
                expected = zigzag_split(whole, report["cp_rank"], CP)
                right = right and _matches(held, expected)
            shapes = ", ".join(
                f"{key} {list(value.shape)}" for key, value in report["held"][0].items()
            )
            print(f"   rank {rank} ({report['where']}): {shapes}")
        print(
            f"   {len(batches)} micro-batches of data-parallel rank 0 sent; every rank holds its "
            f"zigzag share of each: {right}"
        )
        run.checks["get_batch: every rank's share right"] = right

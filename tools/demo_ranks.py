"""What each gloo rank of the demo's TP=2 x CP=2 layout does: read the demo's training loader
on its TP source rank, send the real micro-batches through ``megadist.get_batch``, and report
what it holds (shapes and the tokens themselves, for the parent to check)."""

from __future__ import annotations

import warnings
from typing import Any


def rank_main(settings: dict[str, Any], steps: int) -> dict[str, Any]:
    """One rank: its coordinates, and per step the shape and tokens of every key it holds."""
    warnings.simplefilter("ignore")
    import torch.distributed as dist
    from demo_data import training_loader

    from megadist import build_parallel_groups, get_batch

    layout = build_parallel_groups(tp=2, cp=2)
    # GPTDataset makes attention masks by default, as Megatron-LM does: they travel too
    topology = layout.topology(
        settings["micro_batch_size"], settings["seq_length"], attention_mask=True
    )
    loader = iter(training_loader(settings, dp_rank=0, dp_size=1, workers=0, consumed=0))
    held = []
    for _ in range(steps):
        batch = get_batch(loader if topology.is_source else None, topology)
        held.append(
            {
                key: (list(value.shape), value.tolist())
                for key, value in batch._asdict().items()
                if value is not None
            }
        )
    return {
        "rank": dist.get_rank(),
        "where": layout.describe(),
        "cp_rank": topology.cp_rank,
        "steps": held,
    }

"""Mid-training phases in one process against the seed commit's restart-based run: megaindex
builds every phase's datasets up front, megaload's PhasedDataLoader reads across the
transitions, and the micro-batches equal those of one launch per phase (the seed commit's
training.py sizing each launch, its GPTDataset and sampler reading it), on every DP rank, also
when the run is stopped and resumed inside each phase."""

from __future__ import annotations

from pathlib import Path

import numpy
import pytest

from megafmt.testing import write_corpus
from megaindex import GPTDataset, GPTDatasetConfig
from megaindex.phases import Phase, PhaseSchedule, build_phase_datasets
from megaindex.tokenizer import IdentifiedTokenizer
from megaload import DataLoaderConfig
from megaload.phases import PhasedDataLoader

pytestmark = pytest.mark.compat

SIZES = {"global_batch_size": 8, "micro_batch_size": 2, "dp": 2}
TRAIN_SAMPLES = 96  # 12 iterations


def read(loader: PhasedDataLoader, count: int) -> list[numpy.ndarray]:
    taken = []
    for batch in loader:
        taken.append(batch["tokens"].numpy())
        if len(taken) == count:
            break
    return taken


def test_a_phased_run_equals_the_seed_commit_s_launch_per_phase(seed, tmp_path: Path) -> None:
    web = write_corpus(str(tmp_path / "web"), 60, seed=1)
    code = write_corpus(str(tmp_path / "code"), 40, seed=2)
    blends = [([web], None), ([web, code], [0.3, 0.7]), ([code], None)]
    starts = [0, 4, 9]
    config = {
        "random_seed": 1234, "sequence_length": 16, "split": "90,8,2",
        "reset_position_ids": False, "reset_attention_mask": False, "eod_mask_loss": False,
        "tokenizer": IdentifiedTokenizer.null(1000),
    }  # fmt: skip
    schedule = PhaseSchedule(tuple(Phase(s, blend=b) for s, b in zip(starts, blends, strict=True)))
    built = build_phase_datasets(
        GPTDataset,
        schedule,
        GPTDatasetConfig(blend=blends[0], path_to_cache=str(tmp_path / "ours"), **config),
        SIZES["global_batch_size"],
        TRAIN_SAMPLES,
        [8, 8],
    )
    phases = [(start, datasets[0]) for start, datasets in zip(starts, built, strict=True)]
    total = TRAIN_SAMPLES // SIZES["global_batch_size"] * 2  # micro-batches per rank
    for rank in range(SIZES["dp"]):
        reference = seed.call(
            "seed_phases:restart_based_batches",
            list(zip(starts, blends, strict=True)),
            TRAIN_SAMPLES,
            SIZES,
            {**config, "path_to_cache": str(tmp_path / f"seed-{rank}")},
            rank,
        )
        loader_config = DataLoaderConfig(
            micro_batch_size=2, global_batch_size=8, data_parallel_rank=rank,
            data_parallel_size=2, num_workers=0,
        )  # fmt: skip
        whole = read(PhasedDataLoader(phases, 0, loader_config), total)
        assert len(whole) == len(reference["tokens"]) == total
        for step, (ours, theirs) in enumerate(zip(whole, reference["tokens"], strict=True)):
            numpy.testing.assert_array_equal(ours, theirs, err_msg=f"rank {rank} step {step}")
        assert [len(d[0]) >= n for d, n in zip(built, schedule.train_samples(8, 96), strict=True)]
        assert [launch[0] for launch in reference["launches"]] == schedule.train_samples(8, 96)
        # stopped inside each phase, resumed from the state in a new loader
        for stop in (3, 11, 19):
            first = PhasedDataLoader(phases, 0, loader_config)
            before = read(first, stop)
            state = first.state_dict()
            again = PhasedDataLoader(phases, 0, loader_config)
            again.load_state_dict(state)
            after = read(again, total - stop)
            for step, (ours, theirs) in enumerate(zip(before + after, whole, strict=True)):
                numpy.testing.assert_array_equal(ours, theirs, err_msg=f"stop {stop} step {step}")
        # a launcher restarting at iteration 9 (consumed 72) starts the last phase afresh
        restarted = read(PhasedDataLoader(phases, 72, loader_config), total - 18)
        for step, (ours, theirs) in enumerate(zip(restarted, whole[18:], strict=True)):
            numpy.testing.assert_array_equal(ours, theirs, err_msg=f"restart step {step}")

"""Hybrid context parallelism against the seed commit's own code: the sampler, the balancing
scheduler, the loader wrapper's assignment of sub-sequences to ranks and groups, and get_batch's
``hybrid_cp_group`` / ``local_cp_size``, for seeded random sequence-length mixes.

The gloo tests run 2 and 4 ranks, ours (megaload + megadist) in spawned processes and the
seed's in seed workers (Megatron's own ``initialize_model_parallel(hybrid_context_parallel=
True)`` groups), and compare rank by rank. Stand-ins on the seed's side, only for what needs
CUDA or a process group object (tests/compat/seedside/seed_hybrid_cp.py):

- ``torch.Tensor.cuda`` returns the tensor itself, ``torch.cuda.current_device`` answers
  ``"cpu"``;
- the scheduler-only test gives ``BalancedCPScheduler`` an object with ``size()`` for its
  DPxCP group.
"""

from __future__ import annotations

import itertools
import math
import random
import sys
import types
from pathlib import Path

import numpy
import pytest
from seedref import SeedProcess, call_on_ranks

from megadist.spawn import run_distributed

pytestmark = [pytest.mark.compat]

SEEDSIDE = Path(__file__).parent / "seedside"
sys.path.insert(0, str(SEEDSIDE))
from seed_loader import IndexDataset  # noqa: E402  (seedside/ is put on the path first)

SEQ = 64


def random_lengths(
    rng: random.Random, max_len: int, ranks: int, *, overlong: bool = False
) -> list[int]:
    """A mix of short, medium and long sub-sequences, none needing more ranks than the largest
    power of two among them (CP group sizes are powers of two), unless ``overlong``: then up
    to what all ranks hold, which the seed commit cannot always deal."""
    count = rng.randint(1, 24)
    longest = (ranks if overlong else 2 ** int(math.log2(ranks))) * max_len
    kinds = [(1, max_len), (max_len // 2, 2 * max_len), (max_len, longest)]
    return [min(rng.randint(*rng.choice(kinds)), longest) for _ in range(count)]


@pytest.fixture(scope="module")
def seed_ranks():
    """Four seed workers for the whole module: the scheduler and sampler tests use one each and
    the gloo tests all of them (each world in turn), so the seed commit's ``megatron`` is
    imported once per worker."""
    workers = [SeedProcess(paths=[SEEDSIDE], timeout=300) for _ in range(4)]
    try:
        yield workers
    finally:
        for worker in workers:
            worker.close()


def test_the_sampler_yields_the_seed_commit_s_global_batch_shares(seed_ranks) -> None:
    from megaload import (
        DataLoaderConfig,
        HybridCPMegatronPretrainingSampler,
        build_pretraining_data_loader,
    )
    from megaload.megatron import data_loader_config

    rng = random.Random(14)
    for case in range(10):
        micro, dp = rng.choice([1, 2, 3]), rng.choice([1, 2, 4])
        global_batch = micro * dp * rng.choice([1, 2, 3])
        length = rng.randint(global_batch, 120)
        consumed = rng.choice([0, global_batch * rng.randint(0, length // global_batch - 1)])
        settings = {
            "dataloader_type": "single",
            "hybrid_context_parallel": True,
            "micro_batch_size": micro,
            "global_batch_size": global_batch,
            "eval_micro_batch_size": micro,
            "eval_global_batch_size": global_batch,
            "full_validation": False,
            "data_sharding": True,
            "num_workers": 0,
            "exit_signal_handler": False,
        }
        for rank in range(dp):
            args = (length, consumed, micro, global_batch, rank, dp)
            expected = seed_ranks[3].call("seed_hybrid_cp:sampler_batches", *args, True, 50)
            config = data_loader_config(
                types.SimpleNamespace(**settings), data_parallel_rank=rank, data_parallel_size=dp
            )
            assert config.dataloader_type == "hybrid_cp"
            loader = build_pretraining_data_loader(range(length), consumed, config)
            assert [list(b) for b in itertools.islice(loader.batch_sampler, 50)] == expected, case
            # and keeping the last, partial global batch
            expected = seed_ranks[3].call("seed_hybrid_cp:sampler_batches", *args, False, 50)
            sampler = HybridCPMegatronPretrainingSampler(*args, drop_last=False)
            assert [list(b) for b in itertools.islice(sampler, 50)] == expected, case
        # the loader hands a global batch share over uncollated, as a list of samples
        config = DataLoaderConfig(
            micro_batch_size=micro,
            global_batch_size=global_batch,
            dataloader_type="hybrid_cp",
            data_parallel_size=dp,
            num_workers=0,
        )
        first = next(iter(build_pretraining_data_loader(range(length), consumed, config)))
        assert first == expected_first(consumed, micro, dp, global_batch)


def test_eval_loaders_read_the_seed_commit_s_eval_global_batches(seed_ranks) -> None:
    """Validation and test loaders with hybrid CP: a rank's share of a whole
    ``eval_global_batch_size`` batch of ``eval_micro_batch_size`` micro-batches, as the seed
    commit's build_pretraining_data_loader reads them (its own arguments, its own sampler)."""
    from megaindex import Split
    from megaload import DataLoaderConfig, SamplerError, build_pretraining_data_loader
    from megaload.megatron import data_loader_config

    rng = random.Random(1414)
    for case in range(8):
        micro, dp = rng.choice([1, 2]), rng.choice([1, 2, 4])
        eval_micro = rng.choice([micro, micro + 1, 3])
        settings = {
            "dataloader_type": "single",
            "hybrid_context_parallel": True,
            "micro_batch_size": micro,
            "global_batch_size": micro * dp * 2,
            "eval_micro_batch_size": eval_micro,
            "eval_global_batch_size": eval_micro * dp * rng.choice([1, 3]),
            "full_validation": rng.random() < 0.25,
            "data_sharding": True,
            "num_workers": 0,
            "exit_signal_handler": False,
        }
        split = rng.choice([Split.valid, Split.test, Split.valid, Split.train])
        length = rng.randint(settings["eval_global_batch_size"], 80)
        args = types.SimpleNamespace(**settings)
        for rank in range(dp):
            expected = seed_ranks[3].call(
                "seed_loader:batches", length, split, 0, settings, rank, dp, 40
            )
            config = data_loader_config(args, data_parallel_rank=rank, data_parallel_size=dp)
            loader = build_pretraining_data_loader(IndexDataset(length, split), 0, config)
            got = [list(b) for b in itertools.islice(loader.batch_sampler, 40)]
            assert expected and got == expected, (case, settings, split, rank)
    # without eval_global_batch_size, a different evaluation micro-batch has no step to read
    config = DataLoaderConfig(
        micro_batch_size=1,
        global_batch_size=4,
        eval_micro_batch_size=2,
        dataloader_type="hybrid_cp",
    )
    with pytest.raises(SamplerError, match="eval_global_batch_size"):
        build_pretraining_data_loader(IndexDataset(8, Split.valid), 0, config)


def expected_first(consumed: int, micro: int, dp: int, global_batch: int) -> list[int]:
    """Rank 0's first batch, written out: its micro-batch slice of each block."""
    return [
        consumed + block * micro * dp + i
        for block in range(global_batch // (micro * dp))
        for i in range(micro)
    ]


def test_the_scheduler_deals_as_the_seed_commit_s(seed_ranks) -> None:
    from megaload import BalancedCPScheduler, SchedulingError

    rng = random.Random(2026)
    cases = []
    for _ in range(300):
        ranks = rng.choice([1, 2, 3, 4, 6, 8, 16])
        max_len = rng.choice([8, 16, 32, 100])
        lengths = random_lengths(rng, max_len, ranks, overlong=rng.random() < 0.15)
        cases.append((max_len, ranks, list(enumerate(lengths))))
    expected = seed_ranks[1].call("seed_hybrid_cp:schedules", cases)
    outcomes = {"dealt": 0, "raised": 0}
    for case, answer in zip(cases, expected, strict=True):
        max_len, ranks, items = case
        scheduler = BalancedCPScheduler(max_len, ranks)
        if answer[0] == "raised":
            with pytest.raises(SchedulingError):
                scheduler.groups_and_sub_sequences(items)
            outcomes["raised"] += 1
            continue
        assert scheduler.groups_and_sub_sequences(items) == tuple(answer), case
        outcomes["dealt"] += 1
    assert outcomes["dealt"] > 240 and outcomes["raised"] > 3, outcomes


def packed_sample(rng: random.Random, lengths: list[int]) -> dict:
    """A packed sample holding sub-sequences of ``lengths`` (0: an empty one)."""
    total = sum(lengths)
    bounds = numpy.concatenate([[0], numpy.cumsum(lengths)]).astype(numpy.int32)
    generator = numpy.random.default_rng(rng.randint(0, 2**32))
    return {
        "tokens": generator.integers(0, 1000, total),
        "labels": generator.integers(0, 1000, total),
        "loss_mask": generator.random(total).astype(numpy.float32),
        "position_ids": numpy.arange(total),
        "cu_seqlens": bounds,
        "max_seqlen": numpy.array(max(lengths), dtype=numpy.int32),
    }


def wrapper_case(rng: random.Random, tp: int, cp: int, world: int) -> tuple:
    dp = world // (tp * cp)
    ranks = dp * cp
    max_len = SEQ // ranks
    steps = []
    for _ in range(3):
        step = []
        for _ in range(dp):
            samples = []
            for _ in range(rng.randint(1, 3)):
                lengths = random_lengths(rng, max_len, ranks)[:6]
                if rng.random() < 0.3:
                    lengths.insert(rng.randrange(len(lengths) + 1), 0)
                samples.append(packed_sample(rng, lengths))
            step.append(samples)
        steps.append(step)
    return ("wrapper", tp, cp, max_len, steps)


def get_batch_case(rng: random.Random, tp: int, cp: int, world: int) -> tuple:
    ranks = world // tp
    sizes = [size for size in (1, 2, 4, 8) if size <= ranks]
    micro_batches = []
    for _ in range(4):
        size = rng.choice(sizes)
        length = 2 * size * rng.randint(1, SEQ // (2 * size))
        sample = packed_sample(rng, [length])
        batch = {k: v[None] for k, v in sample.items() if k not in ("cu_seqlens", "max_seqlen")}
        batch["cu_seqlens"] = numpy.array([[0, length]], dtype=numpy.int32)
        batch["max_seqlen"] = numpy.array([length], dtype=numpy.int32)
        batch["local_cp_size"] = numpy.array([size], dtype=numpy.int32)
        micro_batches.append(batch)
    return ("get_batch", tp, cp, micro_batches)


def ours_run(cases: list) -> list:
    """Each case on this rank with megadist's groups, loader wrapper and get_batch."""
    import torch
    import torch.distributed as dist

    from megadist import HybridCPDataLoaderWrapper, build_parallel_groups, get_batch

    answers = []
    for kind, tp, cp, *rest in cases:
        layout = build_parallel_groups(tp=tp, cp=cp, hybrid_cp=True)
        topology = layout.topology(1, SEQ)
        if kind == "wrapper":
            max_len, steps = rest
            dp_rank = layout.coordinates["dp"]
            loaded = [
                [
                    {k: torch.from_numpy(numpy.asarray(v)) for k, v in s.items()}
                    for s in step[dp_rank]
                ]
                for step in steps
            ]
            source = iter(loaded) if topology.is_source else None
            wrapper = HybridCPDataLoaderWrapper(source, topology, max_len)
            taken = []
            for _ in steps:
                received, schedule = next(wrapper)
                if received is not None:
                    received = {
                        gid: {k: v.numpy().copy() for k, v in piece.items()}
                        for gid, piece in received.items()
                    }
                taken.append((schedule, received))
            answers.append(taken)
        else:
            (micro_batches,) = rest
            feed = iter([{k: torch.from_numpy(v) for k, v in b.items()} for b in micro_batches])
            shares = []
            for _ in micro_batches:
                share = get_batch(feed if topology.is_source else None, topology)._asdict()
                group = share["hybrid_cp_group"]
                share["hybrid_cp_group"] = (
                    None if group is None else dist.get_process_group_ranks(group)
                )
                shares.append(
                    {
                        k: v.numpy().copy() if isinstance(v, torch.Tensor) else v
                        for k, v in share.items()
                    }
                )
            answers.append(shares)
    return answers


def assert_same_steps(mine: list, expected: list, where: str) -> None:
    """A wrapper's steps, schedule and sub-sequences received, equal to the seed's."""
    for step, ((schedule, got), (seed_schedule, seed_got)) in enumerate(
        zip(mine, expected, strict=True)
    ):
        assert schedule == seed_schedule, (where, step)
        assert (got is None) == (seed_got is None), (where, step)
        if got is None:
            continue
        assert list(got) == list(seed_got), (where, step)
        for gid in got:
            assert list(got[gid]) == list(seed_got[gid]), (where, step, gid)
            for key in got[gid]:
                numpy.testing.assert_array_equal(
                    got[gid][key], seed_got[gid][key], err_msg=f"{where} {step} {gid}"
                )


def assert_same_share(mine: dict, theirs: dict, where: str) -> None:
    for key in ("tokens", "labels", "loss_mask", "position_ids", "cu_seqlens", "max_seqlen"):
        numpy.testing.assert_array_equal(mine[key], theirs[key], err_msg=f"{where} {key}")
        assert mine[key].dtype == theirs[key].dtype, (where, key)
    assert int(mine["local_cp_size"].reshape(-1)[0]) == int(theirs["local_cp_size"].reshape(-1)[0])
    assert mine["hybrid_cp_group"] == theirs["hybrid_cp_group"], where


@pytest.mark.distributed
@pytest.mark.parametrize(
    ("world", "layouts"),
    [(2, [(1, 1), (1, 2)]), (4, [(1, 1), (1, 2), (1, 4), (2, 1)])],
    ids=["2-ranks", "4-ranks"],
)
def test_ranks_receive_the_seed_commit_s_sub_sequences_groups_and_shares(
    seed_ranks, world, layouts
) -> None:
    rng = random.Random(world)
    cases = []
    for tp, cp in layouts:
        cases.append(wrapper_case(rng, tp, cp, world))
        cases.append(get_batch_case(rng, tp, cp, world))
    ours = run_distributed(ours_run, world, cases, timeout=300)
    # the last wrapper case once more, by training.py's switched wrapper (megadist.megatron's)
    switched = ("switched_wrapper", *cases[-2][1:])
    theirs = call_on_ranks(seed_ranks[:world], "seed_hybrid_cp:hybrid_run", [*cases, switched])
    for rank in range(world):
        assert_same_steps(theirs[rank][-1], theirs[rank][-3], f"rank {rank}, switched wrapper")
    for rank in range(world):
        for index, case in enumerate(cases):
            where = f"rank {rank}, case {index} ({case[0]}, tp {case[1]}, cp {case[2]})"
            mine, expected = ours[rank][index], theirs[rank][index]
            if case[0] == "wrapper":
                assert_same_steps(mine, expected, where)
            else:
                for step, (share, seed_share) in enumerate(zip(mine, expected, strict=True)):
                    assert_same_share(share, seed_share, f"{where}, micro-batch {step}")


@pytest.mark.distributed
def test_megatron_s_default_flags_run_as_at_the_seed_commit(seed_ranks) -> None:
    """``--create-attention-mask-in-dataloader`` (Megatron's default) and ``--micro-batch-size
    2`` with hybrid CP, each wrapper given a ``pg_collection``: at TP 1 the switched wrapper and
    get_batch give the seed's schedules, sub-sequences and shares (no mask: a sub-sequence has
    none); at TP 2, where the seed's broadcast would size its buffers by these flags and
    corrupt the batch, both refuse, naming the flag and the fix."""
    world, rng = 4, random.Random(2727)
    cases = []
    for tp, cp in [(1, 1), (1, 2), (2, 1)]:
        _, _, _, max_len, steps = wrapper_case(rng, tp, cp, world)
        _, _, _, micro_batches = get_batch_case(rng, tp, cp, world)
        cases.append((tp, cp, max_len, steps, micro_batches, 2, SEQ))
    answers = call_on_ranks(seed_ranks[:world], "seed_hybrid_cp:defaults_run", cases)
    for rank, answer in enumerate(answers):
        for (tp, cp, *_), got in zip(cases, answer, strict=True):
            where = f"rank {rank}, tp {tp}, cp {cp}"
            if tp > 1:
                assert "ours_steps" not in got, where
                assert "--create-attention-mask-in-dataloader" in got["ours_refused"], where
                assert "--no-create-attention-mask-in-dataloader" in got["ours_refused"], where
                continue
            assert "ours_refused" not in got, (where, got.get("ours_refused"))
            assert_same_steps(got["ours_steps"], got["seed_steps"], where)
            for step, (mine, theirs) in enumerate(
                zip(got["ours_shares"], got["seed_shares"], strict=True)
            ):
                assert_same_share(mine, theirs, f"{where}, micro-batch {step}")
                assert mine["attention_mask"] is None and theirs["attention_mask"] is None

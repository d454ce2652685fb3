"""Hybrid CP's loader wrapper when a DP rank's share is wrong: an exhausted iterator on one
rank, malformed ``cu_seqlens``, tensors that differ between ranks. Every rank must stop at the
same step with the same kind of error (a rank stopping alone would leave the others waiting
in a collective until the group's timeout, which here is short and would surface as a
CollectiveError instead)."""

from __future__ import annotations

import itertools
import random

import pytest
import torch
import torch.distributed as dist
from hybridcptesting import EveryIdAlone

from megadist import HYBRID_CP_SCHEDULERS, BatchError, HybridCPDataLoaderWrapper
from megadist.hybrid_cp_checks import packed_problem
from megadist.hybrid_cp_loader import sub_sequence_lengths, unpack
from megadist.layout import build_parallel_groups
from megadist.spawn import run_distributed

#: short, so that a rank left waiting fails the test with a CollectiveError, not a hang
GROUP_TIMEOUT = 60.0


def sample(bounds: list, length: int = 8, **extra) -> dict:
    return {
        "tokens": torch.arange(length),
        "labels": torch.arange(length) + 100,
        "cu_seqlens": torch.tensor(bounds),
        **extra,
    }


#: the ways cu_seqlens can be malformed
MALFORMED = ("decrease", "start", "past", "float")


def malformed(rng: random.Random, kind: str) -> tuple[list, str]:
    """A cu_seqlens of ``kind`` a sample of 8 tokens cannot be cut at (drawn by ``rng``), and
    what its error says."""
    if kind == "decrease":
        cut = rng.randrange(2, 8)
        return [0, cut, cut - rng.randrange(1, cut), 8], "decrease at position 2"
    if kind == "start":
        return [rng.randrange(1, 4), 8], "do not start at 0"
    if kind == "past":
        return [0, 4, 8 + rng.randrange(1, 5)], "past its 'tokens'"
    return [0.0, 4.0, 8.0], "expected integers"


def outcome(wrapper: HybridCPDataLoaderWrapper) -> tuple[str, str]:
    try:
        received, _ = next(wrapper)
    except StopIteration:
        return "StopIteration", ""
    except BatchError as error:
        return "BatchError", str(error)
    return "ok", repr({gid: sorted(piece) for gid, piece in received.items()})


def faults_on_rank(seed: int) -> dict:
    HYBRID_CP_SCHEDULERS.register("every_id_alone", EveryIdAlone, replace=True)
    layout = build_parallel_groups(hybrid_cp=True, timeout=GROUP_TIMEOUT)  # DP 2, one DPxCP group
    topology = layout.topology(1, 8)
    dp_rank = dist.get_rank(layout.hybrid_cp.dp_group)
    rng = random.Random(seed)
    bad = [malformed(rng, kind) for kind in MALFORMED]

    def run(feed: list) -> tuple[str, str]:
        wrapper = HybridCPDataLoaderWrapper(iter(feed), topology, 8, scheduler="every_id_alone")
        return outcome(wrapper)

    good = [[sample([0, 3, 8])]]
    # keys in another order on rank 1: routed by the agreed (sorted) order all the same
    reordered = [[{key: good[0][0][key] for key in ("labels", "cu_seqlens", "tokens")}]]
    wrapper = HybridCPDataLoaderWrapper(
        iter(reordered if dp_rank else good), topology, 8, scheduler="every_id_alone"
    )
    received, _ = next(wrapper)
    return {
        "expected": [expected for _, expected in bad],
        "one_exhausted": run([] if dp_rank else good),
        "all_exhausted": run([]),
        "malformed": [run([[sample(bounds)]] if dp_rank else good) for bounds, _ in bad],
        "empty": run([[sample([0, 0, 0])]] if dp_rank else good),
        "other_tensors": run([[sample([0, 8], loss_mask=torch.ones(8))]] if dp_rank else good),
        "other_dtypes": run([[{**sample([0, 8]), "labels": torch.ones(8)}]] if dp_rank else good),
        "reordered": {gid: {k: v.tolist() for k, v in p.items()} for gid, p in received.items()},
    }


@pytest.mark.distributed
@pytest.mark.parametrize("seed", [0, 1])
def test_every_dp_rank_stops_at_the_same_step_with_a_clear_error(seed: int) -> None:
    reports = run_distributed(faults_on_rank, 2, seed)
    for rank, report in enumerate(reports):
        kind, message = report["one_exhausted"]
        assert kind == "BatchError", report
        assert "data iterators of DP ranks [1] are exhausted while DP ranks [0]" in message
        assert report["all_exhausted"] == ("StopIteration", "")
        for (kind, message), expected in zip(report["malformed"], report["expected"], strict=True):
            assert kind == "BatchError" and "DP ranks [1] cannot be cut" in message
            if rank == 1:  # the rank at fault says what is wrong
                assert expected in message and "sample 0's cu_seqlens" in message
        kind, message = report["empty"]
        assert kind == "BatchError" and "DP ranks [1] have no non-empty sub-sequence" in message
        for case in ("other_tensors", "other_dtypes"):
            kind, message = report[case]
            assert kind == "BatchError" and "hold different tensors" in message, report[case]
            assert "[[0], [1]]" in message
    # ids: DP rank 0 holds 0 (3 tokens) and 1 (5); DP rank 1 holds 2 and 3, the same values
    assert reports[0]["reordered"] == {
        0: {"labels": [100, 101, 102], "tokens": [0, 1, 2]},
        2: {"labels": [100, 101, 102], "tokens": [0, 1, 2]},
    }


def reference_problem(bounds: list, length: int) -> bool:
    """Whether ``bounds`` cannot cut ``length`` tokens, by definition."""
    return (
        not bounds
        or bounds[0] != 0
        or any(b < a for a, b in itertools.pairwise(bounds))
        or bounds[-1] > length
    )


@pytest.mark.parametrize("seed", range(5))
def test_packed_problem_accepts_exactly_the_boundaries_that_cut_the_sample(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(200):
        length = rng.randrange(1, 12)
        bounds = sorted(rng.randrange(0, length + 1) for _ in range(rng.randrange(1, 5)))
        if rng.random() < 0.5:  # spoil it
            index = rng.randrange(len(bounds))
            bounds[index] += rng.choice([-3, -1, 1, 3])
        problem = packed_problem([sample(bounds, length)])
        assert (problem is not None) == reference_problem(bounds, length), (bounds, length)
        if problem is None:
            pieces = unpack([sample(bounds, length)])
            lengths = sub_sequence_lengths([sample(bounds, length)])
            assert [len(piece["tokens"]) for piece in pieces] == lengths
            assert all(n > 0 for n in lengths)

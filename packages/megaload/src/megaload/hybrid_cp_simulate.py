"""``mega load simulate --hybrid-cp N``: what hybrid context parallelism deals to each rank,
step by step, without a cluster.

Every simulated data-parallel rank reads its share of each global batch through the
``hybrid_cp`` sampler; the packed samples are cut at their ``cu_seqlens`` into sub-sequences,
numbered in DP-rank order as the loader wrapper numbers them, and dealt to the ``--dp`` x
``--cp`` ranks by the balancing scheduler (:mod:`megaload.hybrid_cp_schedule`) with at most N
tokens of a sequence per rank. Printed per step, group and rank: each sub-sequence the rank
trains on as ``SAMPLE.PIECE`` (the dataset index and the sub-sequence's place in that packed
sample), its length, and the CP group of ranks that shares it. With ``--phases`` the ranks
read through the phased loader, and each line names the phase whose dataset SAMPLE indexes.
``--hash-log`` writes one hash of each step's assignment (without its step number, so a
resumed run's steps compare).
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from megafmt.cli.command import positive_int
from megaload.errors import SimulationError
from megaload.hybrid_cp_schedule import BalancedCPScheduler


def add_arguments(simulate: argparse.ArgumentParser) -> None:
    """``--hybrid-cp MAX_SEQLEN_PER_RANK`` and ``--cp``."""
    group = simulate.add_argument_group("hybrid context parallelism")
    group.add_argument(
        "--hybrid-cp",
        type=positive_int,
        metavar="MAX_SEQLEN_PER_RANK",
        help="print what each DPxCP rank trains on under hybrid context parallelism, at most "
        "this many tokens of a sequence per rank (Megatron's max_seqlen_per_dp_cp_rank); the "
        "samples must be packed (cu_seqlens: --dataset sft)",
    )
    group.add_argument("--cp", type=positive_int, default=1, help="context-parallel size")


def pieces(index: int, sample: Mapping[str, Any]) -> list[tuple[str, int]]:
    """(``SAMPLE.PIECE``, length) of each non-empty sub-sequence of a packed sample."""
    if "cu_seqlens" not in sample:
        raise SimulationError(
            f"sample {index} has no cu_seqlens (keys: {sorted(sample)}); --hybrid-cp deals "
            "packed sub-sequences: use packed samples (--dataset sft)"
        )
    bounds = torch.as_tensor(sample["cu_seqlens"]).reshape(-1).tolist()
    lengths = [end - start for start, end in itertools.pairwise(bounds)]
    return [(f"{index}.{n}", length) for n, length in enumerate(lengths) if length]


def step_assignment(
    shares: list[list[tuple[int, Mapping[str, Any]]]], scheduler: BalancedCPScheduler
) -> list[list[list[tuple[str, int, list[int]]]]]:
    """For one step's samples per DP rank ((index, sample) pairs), per group and DPxCP rank:
    (sub-sequence, length, the ranks sharing it) of everything the rank trains on."""
    named = [piece for share in shares for index, s in share for piece in pieces(index, s)]
    schedule = scheduler.schedule([(gid, length) for gid, (_, length) in enumerate(named)])
    dealt = sorted(gid for group in schedule for gid in {g for ids in group for g in ids})
    if dealt != list(range(len(named))):
        raise SimulationError(
            f"the schedule deals {len(dealt)} sub-sequences of {len(named)} (each must be dealt "
            "once)"
        )
    table = []
    for group in schedule:
        sharing: dict[int, list[int]] = {}
        for rank, ids in enumerate(group):
            for gid in ids:
                sharing.setdefault(gid, []).append(rank)
        table.append([[(named[g][0], named[g][1], sharing[g]) for g in ids] for ids in group])
    return table


def format_step(table: list, cp: int) -> list[str]:
    """One step's assignment as lines, one per group and rank."""
    lines = []
    for group, ranks in enumerate(table):
        for rank, work in enumerate(ranks):
            dealt = "; ".join(
                f"{name} len {length} cp {len(sharing)}"
                + (f" ranks {sharing[0]}-{sharing[-1]}" if len(sharing) > 1 else "")
                for name, length, sharing in work
            )
            where = f"dp {rank // cp} cp {rank % cp}"
            lines.append(f"group {group} rank {rank} ({where}): {dealt}")
    return lines


Share = list[tuple[int, Mapping[str, Any]]]


def loader_shares(loader: Any) -> Iterator[tuple[Share, None]]:
    """Each step's (index, sample) pairs of a ``hybrid_cp`` loader, and no phase."""
    for indices, samples in zip(loader.batch_sampler, loader, strict=False):
        yield list(zip(indices, samples, strict=True)), None


def phased_shares(loader: Any) -> Iterator[tuple[Share, int]]:
    """Each step's (index, sample) pairs of a phased ``hybrid_cp`` loader over datasets whose
    samples carry their index (``sample_id``), and the phase they come from."""
    for samples in loader:
        yield [(int(sample["sample_id"]), sample) for sample in samples], loader.phase


def simulate_hybrid_cp(
    args: argparse.Namespace, streams: list[Iterator[tuple[Share, int | None]]]
) -> int:
    """Print the assignment of ``args.steps`` steps of ``streams`` (one per DP rank, of a step's
    share and its phase: :func:`loader_shares`, :func:`phased_shares`), hash each into
    ``args.hash_log``."""
    scheduler = BalancedCPScheduler(args.hybrid_cp, args.dp * args.cp)
    log = open(args.hash_log, "w") if args.hash_log else None  # noqa: SIM115
    try:
        for step in range(args.steps):
            try:
                shares, phases = zip(*[next(stream) for stream in streams], strict=True)
            except StopIteration:
                print(f"the data ends during step {step}")
                break
            if len(set(phases)) != 1:
                raise SimulationError(f"step {step}: the ranks read phases {list(phases)}")
            lines = format_step(step_assignment(list(shares), scheduler), args.cp)
            if phases[0] is not None:
                lines = [f"phase {phases[0]} {line}" for line in lines]
            print("\n".join(f"step {step} {line}" for line in lines))
            if log is not None:
                log.write(hashlib.sha256("\n".join(lines).encode()).hexdigest() + "\n")
    finally:
        if log is not None:
            log.close()
    return 0

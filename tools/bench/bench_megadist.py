"""get_batch's collectives and their time on gloo: Megatron-LM's protocol (one broadcast per
tensor, then the CP split on every rank) against megadist's packed protocol (the group's
agreement exchange, then one broadcast, the source splitting for its CP rank first), in one run;
and the agreement exchange alone, the price of ranks agreeing before they send.

    .venv/bin/python tools/bench/bench_megadist.py [--iterations 20] [--seq-length 8192]
        [--rows FILE]

Micro-batch 4 x sequence 8192 by default, on ranks spawned on this machine. Megatron-LM's
get_batch_on_this_tp_rank is not in the megatron-core wheel (it lives in megatron.training), so
its side is megadist's ``per_tensor`` wire protocol without the agreement, which issues the same
broadcasts in the same order, followed by ``zigzag_split`` as get_batch_on_this_cp_rank does.
The ranks receive the same tensors either way (the tests check it). Prints collectives and
milliseconds per micro-batch (the slowest rank's mean over the best of 3 alternating rounds),
the ratio, and the agreement's share of megadist's time.
"""

from __future__ import annotations

import itertools
import time

import benchreport
import torch.distributed as dist

from megadist import PROTOCOLS, build_parallel_groups, get_batch, zigzag_split
from megadist.agreement import agree
from megadist.broadcast import _receive_per_tensor, _send_per_tensor, describe
from megadist.collectives import counting_collectives
from megadist.payload import fixed_shapes, prepare_source_batch
from megadist.spawn import run_distributed
from megadist.synthetic import synthetic_batch


def megatron_path(source, topology):
    """Megatron's order: broadcast every tensor of the full batch, then split on every rank."""
    if source:
        batch = prepare_source_batch(next(source), topology)
        _send_per_tensor(batch, topology)
    else:
        batch = _receive_per_tensor(topology, fixed_shapes(topology))
    return zigzag_split(batch, topology.cp_rank, topology.cp_size)


def megadist_path(source, topology):
    return get_batch(source, topology, protocol="packed")


def agreement_alone(source, topology):
    """The exchange megadist's get_batch starts each micro-batch with, by itself."""
    split = "zigzag" if topology.cp_size > 1 else None
    return agree(topology, describe(topology, "packed", split, True), PROTOCOLS)


PATHS = {"megatron": megatron_path, "megadist": megadist_path, "agreement": agreement_alone}
ROUNDS = 3


def measure_on_rank(tp: int, cp: int, options: dict) -> dict:
    """Per path: broadcasts per micro-batch and mean seconds per micro-batch on this rank."""
    layout = build_parallel_groups(tp=tp, cp=cp)
    topology = layout.topology(
        options["micro_batch_size"], options["seq_length"], attention_mask=options["mask"]
    )
    batch = synthetic_batch(
        options["micro_batch_size"], options["seq_length"], attention_mask=options["mask"]
    )
    sources = {name: itertools.repeat(batch) if topology.is_source else None for name in PATHS}
    results = {}
    for name, path in PATHS.items():
        path(sources[name], topology)  # warm-up: allocator, gloo connections
        with counting_collectives() as calls:
            path(sources[name], topology)
        sent = sum(size for _, size in calls)
        results[name] = {"collectives": len(calls), "bytes": sent, "seconds": float("inf")}
    for _ in range(ROUNDS):  # alternate the paths; keep each one's best round
        for name, path in PATHS.items():
            dist.barrier()
            start = time.perf_counter()
            for _ in range(options["iterations"]):
                path(sources[name], topology)
            dist.barrier()
            seconds = (time.perf_counter() - start) / options["iterations"]
            results[name]["seconds"] = min(results[name]["seconds"], seconds)
    return results


def measure(report: benchreport.Report, title: str, tp: int, cp: int, options: dict) -> None:
    ranks = run_distributed(measure_on_rank, tp * cp, tp, cp, options, timeout=1800)
    conditions = f"{title}, gloo ranks on this machine, {options['iterations']} micro-batches"
    report.heading(conditions)
    times = {}
    for name in PATHS:
        times[name] = max(rank[name]["seconds"] for rank in ranks)
        first = ranks[0][name]
        report.note(
            f"{name:<10} {first['collectives']:>3} collectives, {first['bytes'] / 2**20:8.1f} MiB "
            f"sent, {times[name] * 1e3:9.3f} ms/micro-batch"
        )
    report.compare(
        f"get_batch, {title}",
        ours=times["megadist"] * 1e3,
        theirs=times["megatron"] * 1e3,
        unit="ms/batch",
        conditions=conditions + "; slowest rank, best of 3 rounds",
    )
    share = times["agreement"] / times["megadist"]
    report.note(f"the agreement costs {times['agreement'] * 1e6:.0f} us, {share:.1%} of megadist's")


def main() -> None:
    parser = benchreport.parser(__doc__, choices=("megatron-protocol",))
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--micro-batch-size", type=int, default=4)
    parser.add_argument("--seq-length", type=int, default=8192)
    args = parser.parse_args()
    report = benchreport.Report("megadist", args.reference, args.rows)
    base = {"micro_batch_size": args.micro_batch_size, "seq_length": args.seq_length}
    shape = f"micro-batch {args.micro_batch_size} x sequence {args.seq_length}"
    few = max(2, args.iterations // 5)  # a [mbs, 1, S, S] mask is 256 MiB at 4 x 8192
    cases = [
        (f"TP=2, {shape}, no attention mask", 2, 1, {**base, "mask": False}),
        (f"TP=2, {shape}, attention mask", 2, 1, {**base, "mask": True, "iterations": few}),
        (f"TP=2 x CP=2, {shape}, attention mask", 2, 2, {**base, "mask": True, "iterations": few}),
    ]
    for title, tp, cp, options in cases:
        options.setdefault("iterations", args.iterations)
        measure(report, title, tp, cp, options)


if __name__ == "__main__":
    main()

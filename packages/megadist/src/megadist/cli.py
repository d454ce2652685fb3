"""``mega dist demo``: spawn a (tp, cp, pp, dp) layout of gloo ranks on this machine, run
``get_batch`` once on each, and print what every rank holds, so the layout can be seen."""

from __future__ import annotations

import argparse
from typing import Any

import torch

from megadist.broadcast import PROTOCOLS
from megadist.get_batch import get_batch
from megadist.keys import BATCH_KEYS
from megadist.layout import build_parallel_groups
from megadist.spawn import run_distributed
from megadist.synthetic import synthetic_batch, synthetic_batches
from megafmt.cli.command import positive_int


def _describe(key: str, value: torch.Tensor | None, show: int) -> str:
    """One line: the key, its shape and dtype, and the first values of its first row."""
    if value is None:
        return f"  {key:<18} None"
    dtype = str(value.dtype).removeprefix("torch.")
    row = (value[0] if value.dim() >= 2 else value).reshape(-1)
    values = "" if key == "attention_mask" else " ".join(str(int(v)) for v in row[:show])
    more = " ..." if values and row.numel() > show else ""
    return f"  {key:<18} {list(value.shape)!s:<16} {dtype:<8} {values}{more}".rstrip()


def _rank_report(options: dict[str, Any]) -> list[str]:
    """Run on each spawned rank: this rank's layout and its share of the first micro-batch."""
    import torch.distributed as dist

    layout = build_parallel_groups(options["tp"], options["cp"], options["pp"], options["dp"])
    topology = layout.topology(
        options["micro_batch_size"],
        options["seq_length"],
        attention_mask=options["attention_mask"],
        packed_sequences=options["packed"] is not None,
    )
    batches = synthetic_batches(
        options["micro_batch_size"],
        options["seq_length"],
        attention_mask=options["attention_mask"],
        packed_lengths=options["packed"],
    )
    source = batches if topology.is_source else None
    batch = get_batch(source, topology, protocol=options["protocol"])
    role = "reads the loader" if topology.is_source else "receives"
    lines = [f"rank {dist.get_rank()}: {layout.describe()}, {role}"]
    pairs = zip(BATCH_KEYS, batch, strict=True)
    lines += [_describe(key, value, options["show"]) for key, value in pairs]
    return lines


class DistCommand:
    def configure(self, parser: argparse.ArgumentParser) -> None:
        commands = parser.add_subparsers(dest="dist_command", metavar="SUBCOMMAND", required=True)
        demo = commands.add_parser("demo", help="spawn gloo ranks and print what each holds")
        for name, default in (("tp", 2), ("cp", 1), ("pp", 1), ("dp", 1)):
            demo.add_argument(f"--{name}", type=positive_int, default=default, help=f"{name} size")
        demo.add_argument("--micro-batch-size", type=positive_int, default=2)
        demo.add_argument("--seq-length", type=positive_int, default=16)
        demo.add_argument("--attention-mask", action="store_true", help="batches carry masks")
        demo.add_argument(
            "--packed",
            metavar="LENGTHS",
            help="pack documents of these comma-separated lengths into one row (THD; "
            "micro batch size 1, lengths summing to --seq-length)",
        )
        demo.add_argument("--protocol", choices=PROTOCOLS, default="packed")
        demo.add_argument("--show", type=int, default=8, help="values shown per tensor")

    def run(self, args: argparse.Namespace) -> int:
        world = args.tp * args.cp * args.pp * args.dp
        packed = [int(n) for n in args.packed.split(",")] if args.packed else None
        if packed is not None:
            args.micro_batch_size = 1
        options = {
            "tp": args.tp,
            "cp": args.cp,
            "pp": args.pp,
            "dp": args.dp,
            "micro_batch_size": args.micro_batch_size,
            "seq_length": args.seq_length,
            "attention_mask": args.attention_mask,
            "packed": packed,
            "protocol": args.protocol,
            "show": args.show,
        }
        full = synthetic_batch(args.micro_batch_size, args.seq_length, packed_lengths=packed)
        print(
            f"{world} ranks (tp {args.tp} x cp {args.cp} x dp {args.dp} x pp {args.pp}, gloo); "
            f"each TP rank 0 reads micro-batches of {args.micro_batch_size} x {args.seq_length}; "
            f"the first starts tokens[0] = {full['tokens'][0, : args.show].tolist()} ..."
        )
        for lines in run_distributed(_rank_report, world, options, timeout=300):
            print("\n".join(lines))
        return 0

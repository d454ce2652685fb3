"""The ``--ray`` flags of ``mega preprocess``: tokenize the input's shards on a Ray cluster."""

from __future__ import annotations

import argparse

from megafmt.cli.command import positive_int
from megafmt.preprocess.on_ray import RayOptions


def add_ray_arguments(parser: argparse.ArgumentParser) -> None:
    """The flag group of a Ray run."""
    group = parser.add_argument_group("distributed (Ray; pip install 'megafmt[ray]')")
    group.add_argument(
        "--ray",
        action="store_true",
        help="tokenize the input's shards as Ray tasks and merge them in input order (the "
        "bytes of a one-machine run)",
    )
    group.add_argument(
        "--ray-address",
        help="the cluster to join (default: RAY_ADDRESS, else a local cluster of --workers CPUs)",
    )
    group.add_argument(
        "--ray-storage",
        help="shared storage for the shards' outputs: a path every node sees or an fsspec URL "
        "(default: <output-prefix>.shards)",
    )
    group.add_argument(
        "--ray-local-any-interface",
        action="store_true",
        help="accept a local cluster (no --ray-address) whose services listen beyond loopback; "
        "without it such a cluster is shut down and the run refused, naming the sockets",
    )
    group.add_argument(
        "--ray-shard-mb",
        type=positive_int,
        default=256,
        help="input per task; large plain jsonl files are cut on line starts",
    )


def ray_options(args: argparse.Namespace) -> RayOptions | None:
    """The options of a Ray run, or None without ``--ray``."""
    if not args.ray:
        given = [
            flag
            for flag, value in (
                ("--ray-address", args.ray_address),
                ("--ray-storage", args.ray_storage),
                ("--ray-local-any-interface", args.ray_local_any_interface or None),
            )
            if value is not None
        ]
        if given:
            raise SystemExit(f"mega preprocess: {' and '.join(given)} take effect with --ray only")
        return None
    return RayOptions(
        address=args.ray_address,
        storage=args.ray_storage,
        shard_bytes=args.ray_shard_mb << 20,
        allow_exposed_local=args.ray_local_any_interface,
    )

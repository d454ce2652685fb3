"""The fill-in-the-middle flags of ``mega index`` (Megatron-LM's ``--fim-*``, same names and
defaults), turned into GPTFIMDatasetConfig fields for ``--dataset fim``."""

from __future__ import annotations

import argparse
from typing import Any

from megaindex.fim_dataset import DEFAULT_FIM_TOKENS, FIM_TOKEN_KEYS


def add_fim_arguments(parser: argparse.ArgumentParser) -> None:
    fim = parser.add_argument_group("fill-in-the-middle (--dataset fim; Megatron-LM's flags)")
    fim.add_argument("--fim-rate", type=float, default=0.5, help="(default 0.5)")
    fim.add_argument("--fim-spm-rate", type=float, default=0.5, help="(default 0.5)")
    fim.add_argument("--fim-split-sample", help="token to cut segments into fragments at")
    fim.add_argument("--fim-fragment-rate", type=float, help="FIM rate of each fragment")
    fim.add_argument("--fim-no-prefix", help="leave pieces whose text starts with this")
    for key in FIM_TOKEN_KEYS:
        fim.add_argument(
            f"--fim-{key}-token", default=DEFAULT_FIM_TOKENS[key], help="(default %(default)s)"
        )
    fim.add_argument(
        "--fim-sample-seeded",
        action="store_true",
        help="each sample its own random stream (not Megatron-LM's order-dependent one)",
    )


def fim_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The GPTFIMDatasetConfig fields the flags give."""
    return {
        "fim_rate": args.fim_rate,
        "fim_spm_rate": args.fim_spm_rate,
        "fim_extra_tokens": {key: getattr(args, f"fim_{key}_token") for key in FIM_TOKEN_KEYS},
        "fim_split_sample": args.fim_split_sample,
        "fim_fragment_rate": args.fim_fragment_rate,
        "fim_no_prefix": args.fim_no_prefix,
        "fim_sample_seeded": args.fim_sample_seeded,
    }

"""Runs inside the seed worker: the seed commit's tools/ scripts, called as functions."""

from __future__ import annotations

import types


def sequences_per_dataset(arguments: dict) -> dict:
    """tools/build_sequences_per_dataset.py's dict for these data arguments."""
    from tools.build_sequences_per_dataset import build_sequences_per_dataset

    return build_sequences_per_dataset(types.SimpleNamespace(**arguments))


def merge_datasets(input_directory: str, output_prefix: str) -> None:
    """tools/merge_datasets.py run with these flags."""
    import sys

    from tools.merge_datasets import main

    sys.argv = ["merge_datasets.py", "--input", input_directory, "--output-prefix", output_prefix]
    main()


def prepare_cache_flags() -> list[str]:
    """Every ``--flag`` tools/prepare_cache.py's parser takes (Megatron-LM's and its own)."""
    import argparse

    from megatron.training.arguments import add_megatron_arguments
    from tools.prepare_cache import _extra_args_provider

    parser = _extra_args_provider(add_megatron_arguments(argparse.ArgumentParser()))
    return sorted(
        flag
        for action in parser._actions
        for flag in action.option_strings
        if flag.startswith("--")
    )

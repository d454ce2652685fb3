"""Runs inside the seed worker (testing/seedref.py): the seed commit's tokenizers built from
command-line flags by its own parser and ``build_tokenizer``, its tools/preprocess_data.py, and
its GPTDataset cache built with such a tokenizer."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def _tokenizer_args(flags: list[str], sft_prompt_format: str | None = None) -> Any:
    """The flags parsed by the seed's ``_add_tokenizer_args``, with the dummy values
    tools/preprocess_data.py sets before building its tokenizer."""
    from megatron.training.arguments import _add_tokenizer_args

    args = _add_tokenizer_args(argparse.ArgumentParser()).parse_args(flags)
    args.rank = 1
    args.make_vocab_size_divisible_by = 128
    args.tensor_model_parallel_size = 1
    args.vocab_extra_ids = 0
    args.sft_tokenizer_prompt_format = sft_prompt_format
    return args


def _build(flags: list[str], sft_prompt_format: str | None = None) -> Any:
    from megatron.core.tokenizers.utils.build_tokenizer import build_tokenizer

    return build_tokenizer(_tokenizer_args(flags, sft_prompt_format))


def identity(flags: list[str], sft_prompt_format: str | None = None) -> dict:
    """What GPTDataset asks of the tokenizer these flags build: identifiers (as ordered pairs),
    EOD, vocabulary size and pad (None where the tokenizer has none)."""
    tokenizer = _build(flags, sft_prompt_format)
    try:
        pad = tokenizer.pad
    except Exception:  # GPTDataset falls back to its default the same way
        pad = None
    return {
        "identifiers": list(tokenizer.unique_identifiers.items()),
        "eod": tokenizer.eod,
        "vocab_size": tokenizer.vocab_size,
        "pad": pad,
    }


def tokenize(flags: list[str], texts: list[str]) -> list[list[int]]:
    """The ids the tokenizer these flags build gives each text."""
    tokenizer = _build(flags)
    return [list(tokenizer.tokenize(text)) for text in texts]


def preprocess_data(argv: list[str]) -> None:
    """tools/preprocess_data.py run with these command-line arguments."""
    from tools.preprocess_data import main

    sys.argv = ["preprocess_data.py", *argv]
    main()


def gpt_cache(
    flags: list[str],
    prefix: str,
    cache: str,
    samples: list[int],
    sequence_length: int,
    seed: int,
    split: str,
) -> list[str]:
    """GPTDataset's caches built (or loaded) by the seed's builder with the tokenizer these
    flags build; the datasets' description hashes, train/valid/test."""
    from megatron.core.datasets.blended_megatron_dataset_builder import (
        BlendedMegatronDatasetBuilder,
    )
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig

    config = GPTDatasetConfig(
        random_seed=seed,
        sequence_length=sequence_length,
        blend=([prefix], None),
        split=split,
        path_to_cache=cache,
        tokenizer=_build(flags),
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
    )
    datasets = BlendedMegatronDatasetBuilder(GPTDataset, samples, lambda: True, config).build()
    return [dataset.unique_description_hash for dataset in datasets if dataset is not None]

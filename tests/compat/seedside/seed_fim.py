"""Runs inside the seed worker (testing/seedref.py): the seed commit's GPTFIMDataset over a
corpus and a local tokenizer.json, read in a given order (its FIM stream is stateful)."""

from __future__ import annotations

import time
from collections import OrderedDict

DEFAULTS = dict(reset_position_ids=False, reset_attention_mask=False, eod_mask_loss=False)


class LibraryTokenizer:
    """A Megatron tokenizer as GPTFIMDataset and GPTDataset use one: the seed commit's
    HuggingFaceTokenizer library in ``_tokenizer`` (as pretrain_gpt.py's tokenizer holds it,
    with --tokenizer-hf-include-special-tokens off), and the eod, vocabulary size and identity
    the test gives."""

    def __init__(self, directory: str, eod: int, identifiers: dict) -> None:
        from megatron.core.tokenizers.text.libraries.huggingface_tokenizer import (
            HuggingFaceTokenizer,
        )

        self._tokenizer = HuggingFaceTokenizer(directory, include_special_tokens=False)
        self.eod = eod
        self.vocab_size = self._tokenizer.vocab_size
        self.unique_identifiers = OrderedDict(identifiers)


def build(
    prefix: str,
    tokenizer: tuple,
    sizes: list,
    fields: dict,
    builder: str = "seed",
    cls: str = "seed",
) -> list:
    """The splits, built with the seed's GPTFIMDatasetConfig by the ``builder`` and dataset
    class ``cls`` of the seed commit ("seed") or of megaindex ("megaindex")."""
    from megatron.core.datasets import blended_megatron_dataset_builder
    from megatron.training.datasets import fim_dataset

    import megaindex

    config = fim_dataset.GPTFIMDatasetConfig(
        blend=([prefix], None), tokenizer=LibraryTokenizer(*tokenizer), **{**DEFAULTS, **fields}
    )
    source = {"seed": blended_megatron_dataset_builder, "megaindex": megaindex}
    classes = {"seed": fim_dataset, "megaindex": megaindex}
    dataset_class = classes[cls].GPTFIMDataset
    build_with = source[builder].BlendedMegatronDatasetBuilder
    return build_with(dataset_class, sizes, lambda: True, config).build()


def fim_samples(
    prefix: str,
    tokenizer: tuple,
    sizes: list,
    fields: dict,
    reads: list,
    builder: str = "seed",
    cls: str = "seed",
) -> dict:
    """Build the splits (``build``), then read ``reads`` ((split number, sample or None) pairs)
    in order: each sample's arrays up to the first read that raises (``failed``: its number and
    error type, else None), and each split's cache description and hash."""
    datasets = build(prefix, tokenizer, sizes, fields, builder, cls)
    samples, failed = [], None
    for number, (split, idx) in enumerate(reads):
        try:
            sample = datasets[split][idx]
        except Exception as error:  # the seed's failure, reported as data
            failed = (number, type(error).__name__)
            break
        samples.append({key: value.numpy().copy() for key, value in sample.items()})
    return {
        "samples": samples,
        "failed": failed,
        "descriptions": [None if d is None else d.unique_description for d in datasets],
        "hashes": [None if d is None else d.unique_description_hash for d in datasets],
    }


def library_round_trip(directory: str, id_lists: list, texts: list) -> dict:
    """The seed commit's HuggingFaceTokenizer on ids and texts: decoded with special tokens
    removed, encoded, and the ids of tokens."""
    library = LibraryTokenizer(directory, 0, {})._tokenizer
    return {
        "decoded": [library.ids_to_text(ids, remove_special_tokens=True) for ids in id_lists],
        "encoded": [library.text_to_ids(text) for text in texts],
        "tokens": library.tokens_to_ids(["<fim_prefix>", "<|endoftext|>", "not-a-token"]),
    }


def time_samples(prefix: str, tokenizer: tuple, size: int, fields: dict, count: int) -> float:
    """Seconds per sample of the train split's first ``count`` samples (after one warm-up)."""
    dataset = build(prefix, tokenizer, [size, 0, 0], fields)[0]
    dataset[0]
    start = time.perf_counter()
    for idx in range(count):
        dataset[idx % len(dataset)]
    return (time.perf_counter() - start) / count


def loader_batches(
    prefix: str, tokenizer: tuple, sizes: list, fields: dict, micro_batch: int, workers: int
) -> list:
    """The train split's batches as Megatron-LM's loader gives them: torch's DataLoader over
    the seed commit's MegatronPretrainingSampler (one data-parallel rank, from sample 0)."""
    from megatron.training.datasets.data_samplers import MegatronPretrainingSampler
    from torch.utils.data import DataLoader

    dataset = build(prefix, tokenizer, sizes, fields)[0]
    sampler = MegatronPretrainingSampler(len(dataset), 0, micro_batch, 0, 1)
    loader = DataLoader(dataset, batch_sampler=sampler, num_workers=workers)
    return [{key: value.numpy().copy() for key, value in batch.items()} for batch in loader]

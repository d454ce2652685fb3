"""Runs inside the seed worker: the seed commit's indexed_dataset readers, writer and builder,
and its dataset log records, on files a test made. ``describe_index`` and
``dataset_log_records`` import nothing of Megatron's: the tests apply them to our side too."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import numpy


def signatures(names: list[str]) -> dict[str, list[tuple[str, Any]]]:
    """The constructor parameters (name, default) of each class of indexed_dataset."""
    from megatron.core.datasets import indexed_dataset

    found = {}
    for name in names:
        parameters = inspect.signature(getattr(indexed_dataset, name).__init__).parameters
        found[name] = [
            (p.name, None if p.default is inspect.Parameter.empty else p.default)
            for p in list(parameters.values())[1:]
        ]
    return found


def shapes() -> dict:
    """What the seed's other names are: ObjectStorageConfig's fields, _BinReader's abstract
    methods, LowLevelDataset's members (by name)."""
    import dataclasses

    from megatron.core.datasets import indexed_dataset, megatron_dataset

    return {
        "fields": [
            (f.name, None if f.default is dataclasses.MISSING else f.default)
            for f in dataclasses.fields(indexed_dataset.ObjectStorageConfig)
        ],
        "s3_config_is_it": indexed_dataset.S3Config is indexed_dataset.ObjectStorageConfig,
        "abstract": sorted(indexed_dataset._BinReader.__abstractmethods__),
        "low_level": sorted(t.__name__ for t in megatron_dataset.LowLevelDataset.__args__),
    }


def read_index(idx_path: str, multimodal: bool, counts: Any = None, code: Any = None) -> dict:
    """What the seed's ``_IndexReader`` reads (:func:`describe_index`)."""
    from megatron.core.datasets.indexed_dataset import _IndexReader

    return describe_index(_IndexReader(idx_path, multimodal, counts, code))


def describe_index(index: Any) -> dict:
    """An ``_IndexReader``'s attributes and every item, as plain values (either side's)."""
    modes = index.sequence_modes
    return {
        "dtype": numpy.dtype(index.dtype).name,
        "dtype_size": index.dtype_size,
        "sequence_count": index.sequence_count,
        "document_count": index.document_count,
        "sequence_lengths": numpy.array(index.sequence_lengths),
        "sequence_pointers": numpy.array(index.sequence_pointers),
        "document_indices": numpy.array(index.document_indices),
        "sequence_modes": None if modes is None else numpy.array(modes),
        "items": [tuple(x if x is None else int(x) for x in index[i]) for i in range(len(index))],
    }


def write_index(idx_path: str, dtype: str, lengths: list, modes: Any, documents: list) -> None:
    from megatron.core.datasets.indexed_dataset import _IndexWriter

    with _IndexWriter(idx_path, numpy.dtype(dtype).type) as writer:
        writer.write(lengths, modes, documents)


def read_bin(
    reader: str, bin_path: str, dtype: str, reads: list, cache: Any = None, env: Any = None
) -> list:
    """``reads`` of (count, offset) through the named ``_*BinReader`` (object storage readers
    take an ObjectStorageConfig with ``cache`` as path_to_idx_cache, and ``env``: their
    environment, msc enabled)."""
    from megatron.core.datasets import indexed_dataset

    cls = getattr(indexed_dataset, reader)
    with msc_enabled(env) if env else nullcontext():
        if cache is None:
            opened = cls(bin_path)
        else:
            config = indexed_dataset.ObjectStorageConfig(path_to_idx_cache=cache)
            opened = cls(bin_path, config)
        return [numpy.array(opened.read(numpy.dtype(dtype).type, c, o)) for c, o in reads]


@contextmanager
def msc_enabled(environment: dict[str, str]) -> Iterator[None]:
    """multi-storage-client enabled (``--enable-msc``) with ``environment`` set (its config
    file) for one call, as it was afterwards: the worker is shared."""
    import os

    from megatron.core.msc_utils import MultiStorageClientFeature

    saved = {key: os.environ.get(key) for key in environment}
    os.environ.update(environment)
    MultiStorageClientFeature.enable()
    try:
        yield
    finally:
        MultiStorageClientFeature.disable()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def read_dataset(prefix: str, cache: str, env: dict[str, str]) -> dict:
    """Every sequence of the seed's IndexedDataset of an ``msc://`` prefix."""
    from megatron.core.datasets.indexed_dataset import IndexedDataset, ObjectStorageConfig

    with msc_enabled(env):
        config = ObjectStorageConfig(path_to_idx_cache=cache)
        dataset = IndexedDataset(prefix, mmap=False, object_storage_config=config)
        return {
            "sequences": [numpy.array(dataset[i]) for i in range(len(dataset))],
            "document_indices": numpy.array(dataset.document_indices),
        }


def build(prefix: str, dtype: str, documents: list) -> Any:
    """The seed's builder given ``documents`` of (tokens, lengths) as they are; the
    exception's class name when it refuses one."""
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=numpy.dtype(dtype).type)
    for tokens, lengths in documents:
        builder.add_document(tokens, lengths)
    builder.finalize(prefix + ".idx")


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[tuple[str, str, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append((record.name, record.levelname, record.getMessage()))


def gpt_log_records(config_fields: dict, blend: Any, sizes: list, tokenizer: dict) -> list:
    """The records the seed's gpt_dataset and blended_dataset loggers write while
    BlendedMegatronDatasetBuilder builds (or loads) GPTDatasets of ``config_fields``, in a
    one-process gloo group (the seed's BlendedDataset asks for the rank unguarded)."""
    _one_process_group()
    from megatron.core.datasets.blended_megatron_dataset_builder import (
        BlendedMegatronDatasetBuilder,
    )
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
    from megatron.core.tokenizers.text.libraries.null_tokenizer import NullTokenizer

    def build() -> None:
        config = GPTDatasetConfig(
            blend=blend, tokenizer=NullTokenizer(**tokenizer), **config_fields
        )
        BlendedMegatronDatasetBuilder(GPTDataset, sizes, lambda: True, config).build()

    return dataset_log_records(build)[0]


def dataset_log_records(run: Any) -> tuple[list, Any]:
    """The records of the gpt_dataset and blended_dataset loggers while ``run()`` runs (at INFO
    and above), and what it returned."""
    handler = Records()
    names = ("gpt_dataset", "blended_dataset")
    loggers = [logging.getLogger(f"megatron.core.datasets.{name}") for name in names]
    for logger in loggers:
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
    try:
        result = run()
    finally:
        for logger in loggers:
            logger.removeHandler(handler)
    return handler.records, result


def _one_process_group() -> None:
    import os
    import tempfile

    import torch

    if not torch.distributed.is_initialized():
        store = os.path.join(tempfile.mkdtemp(), "store")
        torch.distributed.init_process_group(
            "gloo", init_method=f"file://{store}", rank=0, world_size=1
        )


def prepare_cache(argv: list[str]) -> tuple[list, dict]:
    """tools/prepare_cache.py run with ``argv``: the dataset log records and what main()
    returned. Stub: ``compile_helpers`` (it runs ``make``; the harness placed megatron-core's
    prebuilt helpers_cpp of the same source)."""
    import sys

    import tools.prepare_cache as tool

    _one_process_group()
    tool.compile_helpers = lambda: None
    sys.argv = ["prepare_cache.py", *argv]
    return dataset_log_records(tool.main)


def gpt_train_samples(
    config_fields: dict, blend: Any, sizes: list, vocab: int, count: int, env: dict[str, str]
) -> dict:
    """The seed's GPTDataset train split of ``blend`` (``msc://`` corpora read with
    multi-storage-client enabled): its three tables and the tokens of its first samples."""
    from megatron.core.datasets.blended_megatron_dataset_builder import (
        BlendedMegatronDatasetBuilder,
    )
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
    from megatron.core.tokenizers.text.libraries.null_tokenizer import NullTokenizer

    _one_process_group()
    with msc_enabled(env):
        config = GPTDatasetConfig(blend=blend, tokenizer=NullTokenizer(vocab), **config_fields)
        train = BlendedMegatronDatasetBuilder(GPTDataset, sizes, lambda: True, config).build()[0]
        return {
            "document_index": numpy.array(train.document_index),
            "sample_index": numpy.array(train.sample_index),
            "shuffle_index": numpy.array(train.shuffle_index),
            "tokens": [train[i]["tokens"].numpy() for i in range(count)],
        }

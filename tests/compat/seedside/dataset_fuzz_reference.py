"""One dataset-fuzz case built by a reference (megatron-core 0.16.1 in the test process, or the
seed commit's code in the seedref worker), and any built datasets reduced to comparable digests.

``build(case)`` builds with whatever ``megatron`` is importable; ``summarize`` and
``cache_digests`` reduce datasets and cache files to digests and are used for megaindex's side
too, so both sides are described by the same code. A split whose build would spin forever in the
reference (samples asked of a split without tokens: its epoch loop never ends) raises
``WouldLoopForever`` instead: the test then expects megaindex's clear error.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import warnings
from collections import OrderedDict
from typing import Any


class WouldLoopForever(Exception):
    """The reference was about to loop forever (samples asked of a split without tokens)."""


class FuzzTokenizer:
    """The tokenizer of a case: what the datasets use of one (eod, pad, vocabulary size, the
    identifiers in the cache key)."""

    def __init__(self, eod: int, vocab_size: int, identifiers: dict, pad: int | None) -> None:
        self.eod = eod
        self.vocab_size = vocab_size
        self._identifiers = identifiers
        if pad is not None:
            self.pad = pad

    @property
    def unique_identifiers(self) -> OrderedDict:
        return OrderedDict(self._identifiers)


def digest(array: Any) -> tuple[str, tuple[int, ...], str]:
    """dtype, shape and content hash of a numpy array or torch tensor."""
    import numpy

    if hasattr(array, "numpy"):
        array = array.numpy()
    array = numpy.ascontiguousarray(array)
    return str(array.dtype), tuple(array.shape), hashlib.sha1(array.tobytes()).hexdigest()


def _sample_indices(length: int, fractions: list[float]) -> list[int]:
    if length <= 0:
        return []
    picks = {0, length - 1, *(min(length - 1, int(f * length)) for f in fractions)}
    return sorted(picks)


def _warm_up(dataset: Any) -> bool:
    """Read first a sample whose labels hold no pad id; False when none of the first 64 is.

    megatron-core caches the loss mask of its first sample and zeroes, in that cache, the
    positions whose label is the pad id (the padding of a last partial sample, or data that
    holds the id): every later sample inherits them. The comparison is made where that leak
    is invisible, and megaindex does not reproduce it."""
    pad = dataset._pad_token_id
    for idx in range(min(len(dataset), 64)):
        text, _ = dataset._query_document_sample_shuffle_indices(idx)
        if not (text[1:] == pad).any():
            dataset[idx]
            return True
    return False


def summarize(dataset: Any, fractions: list[float]) -> Any:
    """A split's dataset (or list of them, or None) as digests: class, length, description,
    tables and some samples."""
    if dataset is None:
        return None
    if isinstance(dataset, list):
        return [summarize(part, fractions) for part in dataset]
    length = len(dataset)
    summary: dict[str, Any] = {
        "class": type(dataset).__name__,
        "len": length,
        "description": dataset.unique_description,
    }
    parts = getattr(dataset, "datasets", None)
    comparable = all(
        _warm_up(part) for part in (dataset.datasets if parts else [dataset]) if len(part)
    )
    samples: Any = "not compared: megatron-core's cached loss mask holds a pad position"
    if comparable:
        samples = {}
        for idx in _sample_indices(length, fractions):
            samples[idx] = {key: digest(value) for key, value in sorted(dataset[idx].items())}
    summary["samples"] = samples
    names = (
        ("dataset_index", "dataset_sample_index")
        if parts is not None
        else ("document_index", "sample_index", "shuffle_index")
    )
    summary["tables"] = {
        name: None if getattr(dataset, name) is None else digest(getattr(dataset, name))
        for name in names
    }
    if parts is not None:
        summary["parts"] = [summarize(part, []) for part in parts]
    return summary


def cache_digests(root: str) -> dict[str, Any]:
    """Every index-cache file under ``root`` (megatron-core's names; megaindex's own sidecars
    left out), by path relative to ``root``, with a digest of its content."""
    found = {}
    for folder, _, files in os.walk(root):
        if "cache" not in os.path.relpath(folder, root).split(os.sep):
            continue
        for name in files:
            if name.endswith("-megaindex.json"):
                continue
            path = os.path.join(folder, name)
            with open(path, "rb") as stream:
                found[os.path.relpath(path, root)] = hashlib.sha1(stream.read()).hexdigest()
    return found


def clear_caches(root: str) -> None:
    """Remove every cache folder under ``root`` (each side starts without one)."""
    for folder, subfolders, _ in os.walk(root):
        if "cache" in subfolders:
            shutil.rmtree(os.path.join(folder, "cache"))


def _guard_endless_epochs(gpt_dataset_class: Any) -> None:
    """Make the reference's epoch count raise where its loop would never end."""
    original = gpt_dataset_class._get_num_epochs
    if getattr(original, "guarded", False):
        return

    def _get_num_epochs(self: Any, num_tokens_per_epoch: int) -> int:
        if num_tokens_per_epoch <= 0 and self.num_samples is not None:
            needed = self.num_samples * self.config.sequence_length + int(
                self.config.add_extra_token_to_sequence
            )
            if needed > 0:
                raise WouldLoopForever(f"{self.num_samples} samples of a split without tokens")
        return original(self, num_tokens_per_epoch)

    _get_num_epochs.guarded = True  # type: ignore[attr-defined]
    gpt_dataset_class._get_num_epochs = _get_num_epochs


def outcome(run: Any, case: dict) -> dict[str, Any]:
    """``run()``'s datasets summarized with the cache files, or the exception it raised."""
    clear_caches(case["root"])
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            datasets = run()
            summary = [summarize(d, case["fractions"]) for d in datasets]
    except Exception as error:  # the outcome is the exception
        return {
            "raised": [klass.__name__ for klass in type(error).__mro__],
            "message": str(error)[:500],
        }
    return {
        "built": summary,
        "cache": cache_digests(case["root"]),
        "warnings": [str(w.message) for w in caught if "header" in str(w.message)],
    }


def build_with(
    builder_class: Any, config_class: Any, dataset_class: Any, tokenizer: Any, case: dict
) -> list:
    """The case's datasets from one implementation's classes (priming its cache first when the
    case asks)."""
    fields = dict(case["config"])
    if case.get("is_reference"):
        fields.update(case["reference_overrides"])
    built_on_rank = case.get("built_on_rank", True)
    if case["prime"]:
        primed = dict(fields, fast_cache_load=False, defer_npy_index_mmap=False)
        builder_class(
            dataset_class,
            case["sizes"],
            lambda: built_on_rank,
            config_class(tokenizer=tokenizer, **primed),
        ).build()
    config = config_class(tokenizer=tokenizer, **fields)
    return builder_class(dataset_class, case["sizes"], lambda: built_on_rank, config).build()


def _one_process_group() -> None:
    """A one-process gloo group, as the test process holds: the builders read
    ``is_built_on_rank()`` only in a process group (alone, a process builds everything)."""
    import atexit
    import shutil
    import tempfile

    import torch.distributed

    if not torch.distributed.is_initialized():
        folder = tempfile.mkdtemp(prefix="fuzz-pg-")
        atexit.register(shutil.rmtree, folder, ignore_errors=True)  # not left in /tmp
        store = os.path.join(folder, "store")
        torch.distributed.init_process_group(
            "gloo", init_method=f"file://{store}", rank=0, world_size=1
        )


def build(case: dict) -> dict[str, Any]:
    """The reference's outcome for ``case`` (megatron-core or the seed, whichever imports)."""
    from megatron.core.datasets.blended_megatron_dataset_builder import (
        BlendedMegatronDatasetBuilder,
    )
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig, MockGPTDataset

    _guard_endless_epochs(GPTDataset)
    _one_process_group()
    tokenizer = FuzzTokenizer(**case["tokenizer"])
    dataset_class = MockGPTDataset if case["mock"] else GPTDataset
    reference_case = dict(case, is_reference=True)
    return outcome(
        lambda: build_with(
            BlendedMegatronDatasetBuilder,
            GPTDatasetConfig,
            dataset_class,
            tokenizer,
            reference_case,
        ),
        case,
    )

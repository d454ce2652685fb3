"""``MegatronDataset``: the base of mid-level datasets, and their identity for caching.

A dataset's identity is a JSON description of its class, corpus path, sample count, split and
the configuration fields that shape its indices; the md5 of that text names its cache files.
Both are computed exactly as megatron-core computes them, so the two share caches.
"""

from __future__ import annotations

import contextlib
import hashlib
import operator
import warnings
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy
import torch
from torch.utils.data import default_collate

from megafmt import IndexedDataset
from megafmt.protocols import CollatedBatch
from megafmt.readers import is_url
from megafmt.redaction import redact
from megaindex.batch_merge import merge_rows
from megaindex.config import BlendedMegatronDatasetConfig
from megaindex.indented_json import indented_json
from megaindex.utils import Split, index_array

#: what a mid-level dataset reads from (megatron-core's alias): an ``IndexedDataset`` or any
#: other iterable its ``build_low_level_dataset`` returns
LowLevelDataset = IndexedDataset | Iterable

#: the pad id used when the tokenizer has none (or one that collides with another special token)
PAD_TOKEN_ID = -1


def _identifiers_of(obj: Any) -> Any:
    """What an object in a description stands for: its ``unique_identifiers`` (a tokenizer's,
    a sub-dataset's), as megatron-core's ``default`` takes them."""
    return obj.unique_identifiers


def describe(identifiers: OrderedDict) -> tuple[str, str]:
    """The description text of ``identifiers`` and its md5, as megatron-core writes them."""
    description = indented_json(identifiers, _identifiers_of)
    return description, hashlib.md5(description.encode("utf-8"), usedforsecurity=False).hexdigest()


def _special_tokens(tokenizer: Any) -> list[int]:
    """The tokenizer's special ids other than pad (its special_tokens_dict, else eos and eod)."""
    try:
        tokens = [v for k, v in tokenizer.special_tokens_dict.items() if k != "pad_token"]
    except (AttributeError, IndexError, ValueError):
        tokens = []
    if not tokens:
        for name in ("eos", "eod"):
            with contextlib.suppress(AttributeError, NotImplementedError):
                tokens.append(getattr(tokenizer, name))
    return tokens


def resolve_indices(
    indices: Sequence[int | None], length: Callable[[], int]
) -> tuple[list[int], list[bool]]:
    """``indices`` as sample numbers, and which are padding: None is a padding sample (sample
    0's tokens with no loss, megatron-core's ``idx=None``), a negative index counts from the
    end as numpy's would (``length`` is asked only then)."""
    samples, padding = [], []
    for idx in indices:
        if idx is None:
            samples.append(0)
            padding.append(True)
            continue
        number = operator.index(idx)
        if number < 0:
            number += length()
            if number < 0:
                raise IndexError(f"sample {idx} out of range for {length()} samples")
        samples.append(number)
        padding.append(False)
    return samples, padding


def one_sample_at_a_time(cls: type) -> None:
    """For a subclass (of a dataset that assembles batches) that overrides ``__getitem__`` but
    not ``__getitems__``: batches are made of its own samples, one by one, so the DataLoader
    never bypasses its ``__getitem__`` (megatron-core's MockMultimodalDataset adds an image
    there)."""
    if "__getitem__" in vars(cls) and "__getitems__" not in vars(cls):
        cls.__getitems__ = samples_one_by_one  # type: ignore[attr-defined]
        cls.assembles_batches = False  # type: ignore[attr-defined]


def described_path(path: str | None) -> str | None:
    """``path`` as a dataset's description records it: a URL without its credentials (user
    info, a presigned URL's signature), since the description is written beside the tables and
    names them (a new signature of the same object finds the same tables); any other path as
    given, as megatron-core's description holds it."""
    return redact(path) if path is not None and is_url(path) else path


def samples_one_by_one(self: Any, indices: Sequence[Any]) -> CollatedBatch:
    """The samples ``self[idx]`` of ``indices``, collated as torch's default collation
    collates them: the batch of a class that makes its samples in ``__getitem__``."""
    return CollatedBatch(default_collate([self[idx] for idx in indices]))


class MegatronDataset(ABC, torch.utils.data.Dataset):
    """A mid-level dataset over a low-level one (``dataset``), restricted to ``indices``.

    Every subclass is a :class:`~megafmt.protocols.BatchAssembly`: by default its batches are
    its samples one by one, collated (a subclass that assembles them faster overrides
    ``__getitems__``), and batches of its kind merge key by key (a subclass whose rows differ
    in shape overrides ``merge_batches``).
    """

    __getitems__ = samples_one_by_one

    def merge_batches(
        self, batches: Sequence[CollatedBatch], rows: Sequence[Sequence[int]]
    ) -> CollatedBatch:
        """One batch with row ``j`` of ``batches[i]`` at row ``rows[i][j]`` (what a blend of
        datasets of this class makes of its parts' rows)."""
        return merge_rows(batches, rows)

    #: whether its dataset paths are ``.bin``/``.idx`` prefixes, which the builder checks (and
    #: whose tokenizer manifests it compares) before building anything; a class that loads
    #: other files keeps the default and opens its paths itself
    reads_indexed_corpora: bool = False

    def __init__(
        self,
        dataset: Any,
        dataset_path: str | None,
        indices: numpy.ndarray | range | None,
        num_samples: int | None,
        index_split: Split,
        config: BlendedMegatronDatasetConfig,
    ) -> None:
        self.dataset = dataset
        self.dataset_path = dataset_path
        self.indices = indices
        self.num_samples = num_samples
        self.index_split = index_split
        self.config = config

        self.unique_identifiers: OrderedDict = OrderedDict()
        self.unique_identifiers["class"] = type(self).__name__
        self.unique_identifiers["dataset_path"] = described_path(self.dataset_path)
        self.unique_identifiers["num_samples"] = self.num_samples
        self.unique_identifiers["index_split"] = self.index_split.name
        for attribute in self._key_config_attributes():
            self.unique_identifiers[attribute] = getattr(self.config, attribute)
        self.unique_description, self.unique_description_hash = describe(self.unique_identifiers)
        self._pad_token_id = self._choose_pad_token_id()

    @property
    def indices(self) -> numpy.ndarray | None:
        """The low-level dataset's elements this dataset draws from (megatron-core's attribute,
        an int32 array; None: all of them). A ``range`` given for them (the builder's splits)
        becomes that array on first use, never on a cache hit that does not read it."""
        self._indices = index_array(self._indices)
        return self._indices

    @indices.setter
    def indices(self, indices: numpy.ndarray | range | None) -> None:
        self._indices = indices

    def _choose_pad_token_id(self) -> int:
        """The id windows are padded with and masked at: the tokenizer's pad, or
        :data:`PAD_TOKEN_ID` when it has none or that id is another special token's.

        A pad of None (a HuggingFace tokenizer without a pad token) counts as none. megatron-core
        keeps None: its samples equal ours wherever it makes them (no id equals None, none of a
        corpus equals -1), and it raises a TypeError where it would pad a window or set the last
        label (a partial validation sample, ``add_extra_token_to_sequence`` off)."""
        try:
            pad = self.config.tokenizer.pad
        except Exception:
            return PAD_TOKEN_ID
        if pad is None:
            return PAD_TOKEN_ID
        if pad not in _special_tokens(self.config.tokenizer):
            return pad
        if self.config.allow_ambiguous_pad_tokens:
            warnings.warn(
                f"the tokenizer's pad id {pad} is also another special token's id, and "
                "allow_ambiguous_pad_tokens is set: those tokens will be masked from the loss, "
                "which can make training unstable",
                stacklevel=3,
            )
            return pad
        warnings.warn(
            f"the tokenizer's pad id {pad} is also another special token's id; padding uses "
            f"{PAD_TOKEN_ID} instead, so tokens with id {pad} already in the data keep their "
            "loss (give the tokenizer a distinct pad id to avoid this)",
            stacklevel=3,
        )
        return PAD_TOKEN_ID

    @staticmethod
    def numel_low_level_dataset(low_level_dataset: Any) -> int:
        """How many elements of the low-level dataset the splits divide."""
        raise NotImplementedError

    @staticmethod
    def build_low_level_dataset(dataset_path: str, config: BlendedMegatronDatasetConfig) -> Any:
        """Open the low-level dataset at ``dataset_path``."""
        raise NotImplementedError

    @staticmethod
    def _key_config_attributes() -> list[str]:
        """The configuration fields that are part of the dataset's identity (cache key)."""
        return ["random_seed", "sequence_length", "split", "split_matrix", "tokenizer"]

    @abstractmethod
    def __len__(self) -> int: ...

    @abstractmethod
    def __getitem__(self, idx: int) -> dict[str, Any]: ...

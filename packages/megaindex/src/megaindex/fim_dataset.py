"""``GPTFIMDataset``: GPT samples rearranged for fill-in-the-middle training (code models).

Drop-in for Megatron-LM's ``megatron.training.datasets.fim_dataset`` (``--fim-data``): the same
configuration fields and defaults, GPTDataset's three tables and cache unchanged (the cache is
named for the class, ``<md5>-GPTFIMDataset-<split>-...``, under ``GPTFIMDataset_indices``, as
the seed commit names it), and each sample rearranged by :mod:`megaindex.fim` exactly as the
seed commit rearranges it. Samples equal the seed commit's sample by sample for the same corpus,
seed, tokenizer and options. Megatron-LM's own ``GPTFIMDatasetConfig`` is accepted as well
(its fields checked as ours are; ``fim_sample_seeded``, which it lacks, is off).

The random stream is stateful, as in Megatron-LM: one ``RandomState(random_seed)`` per dataset
object, drawn from by every sample it serves, padding samples included (they are sample 0). A
sample therefore depends on the samples read before it by the same object: read in another
order, or by another copy, it comes out differently. In a DataLoader each worker holds its own
copy, whose stream starts afresh at the seed; a resumed job starts its streams afresh too (the
seed commit saves no FIM state), so its samples after the resume point differ from those of an
uninterrupted run. Megatron-LM behaves the same way, and this is the default, so that samples
match it. ``fim_sample_seeded`` is the explicit alternative: each sample draws from a stream of
its own, seeded by ``(random_seed, sample number)``, so samples depend only on their number
(the same with any worker count, order or resume point), and no longer match Megatron-LM's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, runtime_checkable

import numpy

from megafmt.protocols import TextTokenizer
from megaindex.config import GPTDatasetConfig, own_field
from megaindex.errors import ConfigError
from megaindex.fim import FIMRates, FIMRearranger, FIMTokens
from megaindex.gpt_dataset import GPTDataset
from megaindex.tokenizer import IdentifiedTokenizer

#: the keys of ``fim_extra_tokens``, in the order of Megatron-LM's ``--fim-*-token`` flags
FIM_TOKEN_KEYS = ("prefix", "middle", "suffix", "pad", "eod")
#: Megatron-LM's defaults of ``--fim-prefix-token`` ... ``--fim-eod-token``
DEFAULT_FIM_TOKENS = {
    "prefix": "<fim_prefix>",
    "middle": "<fim_middle>",
    "suffix": "<fim_suffix>",
    "pad": "<fim_pad>",
    "eod": "<|endoftext|>",
}


def _check_rate(name: str, value: Any, needed: bool = True) -> None:
    if value is None and not needed:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise ConfigError(
            f"GPTFIMDatasetConfig.{name} must be a probability in [0, 1], got {value!r}"
        )


@dataclass
class GPTFIMDatasetConfig(GPTDatasetConfig):
    """GPTDatasetConfig with Megatron-LM's FIM fields (``--fim-rate`` ... ``--fim-*-token``)."""

    fim_rate: float | None = None
    """Probability that a sample's piece is rearranged (``--fim-rate``, 0.5 there)."""

    fim_spm_rate: float | None = None
    """Probability that a rearranged piece takes SPM form over PSM (``--fim-spm-rate``)."""

    fim_extra_tokens: dict[str, str] | None = None
    """The sentinel token strings by key: prefix, middle, suffix, pad and eod."""

    fim_split_sample: str | None = None
    """A token string to cut segments at (files in a repository), each fragment rearranged on
    its own."""

    fim_fragment_rate: float | None = None
    """Probability that a fragment is rearranged, when ``fim_split_sample`` is set. None (the
    default of ``--fim-fragment-rate``) is accepted as the seed commit accepts it: samples are
    served until one draws a segment holding the split token for rearranging, which is an
    error (the seed's is numpy's ``TypeError`` there)."""

    fim_no_prefix: str | None = None
    """Pieces whose text starts with this string are never rearranged."""

    fim_sample_seeded: bool = False
    """Not in Megatron-LM: draw each sample from its own RandomState((random_seed, sample)),
    so samples do not depend on the order they are read in (and do not match Megatron-LM's)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_fim_fields(self)


@runtime_checkable
class FIMFields(Protocol):
    """A config with Megatron-LM's FIM fields: ours, or Megatron-LM's own
    ``GPTFIMDatasetConfig`` (what pretrain_gpt.py --fim-data builds unless switched)."""

    fim_rate: float | None
    fim_spm_rate: float | None
    fim_extra_tokens: dict[str, str] | None
    fim_split_sample: str | None
    fim_fragment_rate: float | None
    fim_no_prefix: str | None


def check_fim_fields(config: FIMFields) -> None:
    """Refuse FIM fields that cannot rearrange a sample, naming the field and its value."""
    _check_rate("fim_rate", config.fim_rate)
    _check_rate("fim_spm_rate", config.fim_spm_rate)
    # None (Megatron-LM's default) is accepted, as the seed accepts it: it fails only when a
    # sample reaches a fragment (megaindex.fim)
    _check_rate("fim_fragment_rate", config.fim_fragment_rate, needed=False)
    tokens = config.fim_extra_tokens
    missing = [k for k in FIM_TOKEN_KEYS if not isinstance((tokens or {}).get(k), str)]
    if missing:
        raise ConfigError(
            "GPTFIMDatasetConfig.fim_extra_tokens must map prefix, middle, suffix, pad and "
            f"eod to token strings; {', '.join(missing)} missing or not a string in {tokens!r}"
        )


@runtime_checkable
class MegatronTextTokenizer(Protocol):
    """A Megatron tokenizer (``megatron.core.tokenizers``): the library tokenizer it wraps is
    ``_tokenizer``, which Megatron-LM's FIM dataset decodes and encodes with."""

    _tokenizer: Any


def text_tokenizer(tokenizer: Any) -> TextTokenizer:
    """What FIM decodes and encodes with: ``tokenizer`` itself when it maps text and ids both
    ways (megafmt's huggingface tokenizer), the ``text`` of an IdentifiedTokenizer, else the
    library tokenizer a Megatron tokenizer wraps (its ``_tokenizer``, which Megatron-LM's FIM
    dataset uses)."""
    if isinstance(tokenizer, TextTokenizer):
        return tokenizer
    if isinstance(tokenizer, IdentifiedTokenizer) and tokenizer.text is not None:
        return tokenizer.text
    if isinstance(tokenizer, MegatronTextTokenizer) and isinstance(
        tokenizer._tokenizer, TextTokenizer
    ):
        return tokenizer._tokenizer
    found = type(tokenizer).__name__
    if isinstance(tokenizer, IdentifiedTokenizer):
        found = "an IdentifiedTokenizer without text (pass text=, or --tokenizer-model to mega)"
    raise ConfigError(
        f"GPTFIMDataset needs a tokenizer with tokens_to_ids, text_to_ids and ids_to_text "
        f"(megafmt.protocols.TextTokenizer, or a Megatron tokenizer wrapping one), got {found}"
    )


def _token_id(tokenizer: TextTokenizer, token: str, what: str) -> int:
    ids = tokenizer.tokens_to_ids([token])
    if len(ids) != 1 or not isinstance(ids[0], (int, numpy.integer)):
        raise ConfigError(f"the {what} token {token!r} is not one token of the vocabulary: {ids}")
    return int(ids[0])


def fim_tokens(tokenizer: TextTokenizer, config: FIMFields) -> FIMTokens:
    """The sentinel ids ``config`` names, looked up with ``tokenizer``."""
    extra = config.fim_extra_tokens or {}  # holds every key: the config checked it
    ids = {key: _token_id(tokenizer, extra[key], f"FIM {key}") for key in FIM_TOKEN_KEYS}
    split = config.fim_split_sample
    split_id = None if not split else _token_id(tokenizer, split, "fim_split_sample")
    return FIMTokens(**ids, split=split_id)


class GPTFIMDataset(GPTDataset):
    """GPTDataset whose samples are rearranged for fill-in-the-middle (see the module)."""

    shapes_samples: ClassVar[bool] = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """GPTDataset's constructor (and megatron-core's): ``indexed_dataset, dataset_path,
        indexed_indices, num_samples, index_split, config``, the config a
        GPTFIMDatasetConfig, ours or Megatron-LM's (checked here as ours checks itself)."""
        super().__init__(*args, **kwargs)
        config = self.config
        if not isinstance(config, FIMFields):
            raise ConfigError(
                "GPTFIMDataset needs a GPTFIMDatasetConfig (megaindex's or Megatron-LM's), got "
                f"{type(config).__name__}"
            )
        if not isinstance(config, GPTFIMDatasetConfig):
            check_fim_fields(config)
        #: the FIM stream (Megatron-LM's attribute name): every sample served draws from it
        self.np_rng = numpy.random.RandomState(seed=config.random_seed)
        tokenizer = text_tokenizer(config.tokenizer)
        self.fim_tokens = fim_tokens(tokenizer, config)
        self.fim = FIMRearranger(
            tokenizer,
            self.fim_tokens,
            FIMRates(
                config.fim_rate, config.fim_spm_rate, config.fim_fragment_rate, config.fim_no_prefix
            ),
        )

    def shape_sample(self, idx: int, text: numpy.ndarray) -> numpy.ndarray:
        """Sample ``idx``'s window rearranged; a window the stream ended in keeps its padding
        (GPTDataset's) after the rearranged tokens."""
        length = self._sample_length(idx)
        rng = self.np_rng
        if own_field(self.config, GPTFIMDatasetConfig, "fim_sample_seeded"):
            rng = numpy.random.RandomState([self.config.random_seed, idx])
        text[:length] = self.fim.rearrange(rng, text[:length])
        return text

    def _sample_length(self, idx: int) -> int:
        """How many of the window's tokens are the sample's: all, unless this split keeps a
        last partial sample (a validation split may)."""
        if self._drop_last_partial_sequence:
            return self.window_length
        documents, firsts, counts = self.sample_spans(idx)
        lengths = self.dataset.sequence_lengths
        return sum(
            int(lengths[doc]) - first if count is None else count
            for doc, first, count in zip(documents, firsts, counts, strict=True)
        )

    def _query_document_sample_shuffle_indices(
        self, idx: int
    ) -> tuple[numpy.ndarray, numpy.ndarray]:
        """Sample ``idx``'s rearranged tokens and its document ids (Megatron-LM's method: it
        draws from the FIM stream as serving the sample does)."""
        text, documents = super()._query_document_sample_shuffle_indices(idx)
        return self.shape_sample(idx, text), documents

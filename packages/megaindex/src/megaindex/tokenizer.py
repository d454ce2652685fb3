"""A stand-in tokenizer for building datasets without loading a real tokenizer.

A GPTDataset uses three things of its tokenizer: the end-of-document id, the vocabulary size
(for the token dtype) and ``unique_identifiers``, which become part of the cache key. A FIM
dataset also turns ids into text and back: ``text`` carries a tokenizer that can. Building a
cache offline that a training job will hit needs exactly the identifiers the job's tokenizer
reports; this class carries them without the tokenizer's files or libraries.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from megafmt.protocols import TextTokenizer
from megafmt.tokenizers import Tokenizer, TokenizerOptions, load_tokenizer
from megafmt.tokenizers.identity import megatron_identifiers

#: megatron-core's NullTokenizer, as its unique_identifiers name it
MEGATRON_NULL_TOKENIZER = "megatron.core.tokenizers.text.libraries.null_tokenizer.NullTokenizer"


class IdentifiedTokenizer:
    """The identity of a tokenizer: ``eod``, ``vocab_size``, optional ``pad`` and identifiers."""

    def __init__(
        self,
        eod: int,
        vocab_size: int | None,
        unique_identifiers: dict[str, Any],
        pad: int | None = None,
        text: TextTokenizer | None = None,
    ) -> None:
        self.eod = eod
        self.vocab_size = vocab_size
        self._identifiers = OrderedDict(unique_identifiers)
        if pad is not None:
            self.pad = pad
        #: the tokenizer itself, where a dataset needs text (fill-in-the-middle) or a display
        #: decodes ids; None when only the identity is known
        self.text = text

    @property
    def unique_identifiers(self) -> OrderedDict:
        return OrderedDict(self._identifiers)

    @classmethod
    def null(cls, vocab_size: int) -> IdentifiedTokenizer:
        """megatron-core's NullTokenizer(vocab_size): EOD is ``vocab_size``, one id more in all."""
        return cls(vocab_size, vocab_size + 1, {"class": MEGATRON_NULL_TOKENIZER})

    @classmethod
    def from_flags(cls, tokenizer_type: str, options: TokenizerOptions) -> IdentifiedTokenizer:
        """The identity of the tokenizer Megatron builds from these flags (``--tokenizer-type``
        and the rest, as ``mega preprocess`` and Megatron's tools take them): EOD, vocabulary
        size and pad from the tokenizer itself, identifiers as the ``options.compat`` release
        reports them. A cache built with it is the training job's cache."""
        return cls.of(load_tokenizer(tokenizer_type, options), tokenizer_type, options)

    @classmethod
    def of(
        cls, tokenizer: Tokenizer, tokenizer_type: str, options: TokenizerOptions
    ) -> IdentifiedTokenizer:
        """The identity of ``tokenizer``, already built from these flags (see
        :meth:`from_flags`)."""
        if tokenizer.eod is None:
            raise ValueError(f"the {tokenizer_type} tokenizer has no end-of-document token")
        return cls(
            tokenizer.eod,
            tokenizer.vocab_size,
            megatron_identifiers(tokenizer_type, options),
            pad=tokenizer.pad,
            text=tokenizer if isinstance(tokenizer, TextTokenizer) else None,
        )

    def __repr__(self) -> str:
        return f"IdentifiedTokenizer(eod={self.eod}, vocab_size={self.vocab_size})"

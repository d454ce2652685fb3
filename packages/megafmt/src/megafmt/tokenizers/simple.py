"""Tokenizers that need no files: ``bytes`` (UTF-8 bytes) and ``null`` (Megatron's
NullTokenizer: the text is already ids)."""

from __future__ import annotations

from collections.abc import Sequence

from megafmt.errors import PluginError
from megafmt.tokenizers.base import CORE_0_16, TokenizerOptions, fingerprint_of

BYTE_EOD = 256


class BytesTokenizer:
    """Each UTF-8 byte of the text is a token (0-255); 256 ends a document. For demos and tests:
    no download, no vocabulary file, any text."""

    name = "bytes"
    vocab_size = BYTE_EOD + 1
    eod = BYTE_EOD
    pad = None
    fingerprint = fingerprint_of("bytes", ())

    @classmethod
    def from_options(cls, options: TokenizerOptions) -> BytesTokenizer:
        return cls()

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [list(text.encode("utf-8")) for text in texts]


class NullTokenizer:
    """Megatron's NullTokenizer: the text holds ids separated by single spaces. At the seed
    commit the vocabulary is ``--vocab-size`` and the EOD ``--null-tokenizer-eod-id`` (default
    ``vocab_size - 1``), the pad ``--null-tokenizer-pad-id`` (default -1: none); in
    megatron-core 0.16.1 the EOD is ``--vocab-size`` and the vocabulary one larger. A text that
    is not such a list of integers (an empty one included) is an error, as in Megatron."""

    name = "null"

    def __init__(self, vocab_size: int, eod: int, pad: int | None) -> None:
        self.vocab_size = vocab_size
        self.eod = eod
        self.pad = pad
        self.fingerprint = fingerprint_of("null", (), vocab_size, eod, pad)

    @classmethod
    def from_options(cls, options: TokenizerOptions) -> NullTokenizer:
        vocab_size = options.vocab_size
        if vocab_size is None or vocab_size < 1:
            raise PluginError(
                f"the null tokenizer needs --vocab-size (a positive integer), found {vocab_size}"
            )
        if options.compat == CORE_0_16:
            return cls(vocab_size + 1, vocab_size, None)
        eod = vocab_size - 1 if options.null_eod_id is None else options.null_eod_id
        return cls(vocab_size, eod, options.null_pad_id)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        encoded = []
        for text in texts:
            try:
                encoded.append([int(piece) for piece in text.split(" ")])
            except ValueError:
                raise ValueError(
                    f"the null tokenizer expects integers separated by single spaces, "
                    f"found {text[:40]!r}"
                ) from None
        return encoded

"""``sentencepiece``: a local SentencePiece ``.model``, as Megatron's SentencePieceTokenizer
encodes with its defaults; a document ends with the model's eos id."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from megafmt.errors import FormatError
from megafmt.tokenizers.base import TokenizerOptions, fingerprint_of, import_library, require_file


class SentencePieceTokenizer:
    name = "sentencepiece"

    def __init__(self, processor: Any, fingerprint: str) -> None:
        self._processor = processor
        self.vocab_size = processor.get_piece_size()
        eos = processor.eos_id()
        self.eod = eos if eos >= 0 else None
        self.fingerprint = fingerprint

    @classmethod
    def from_options(cls, options: TokenizerOptions) -> SentencePieceTokenizer:
        sentencepiece: Any = import_library("sentencepiece", cls.name, "sentencepiece")
        path = require_file(options.model, "--tokenizer-model", "the sentencepiece tokenizer")
        try:
            processor = sentencepiece.SentencePieceProcessor(model_file=path)
        except (OSError, RuntimeError) as error:
            raise FormatError(f"{path}: not a SentencePiece model ({error})") from None
        return cls(processor, fingerprint_of(cls.name, [path]))

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return self._processor.encode(list(texts), out_type=int)

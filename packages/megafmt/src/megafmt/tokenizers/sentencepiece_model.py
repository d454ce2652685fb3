"""``sentencepiece``: a local SentencePiece ``.model``, as Megatron's SentencePieceTokenizer
encodes; a document ends with the model's eos id.

With ``--no-tokenizer-sentencepiece-ignore-extra-whitespaces``, a model that collapses runs of
spaces gets them kept as Megatron keeps them: a marker character is put between neighbouring
spaces and at either end of the text, each piece is encoded with the marker appended and the
marker's id (the last) dropped.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from megafmt.errors import FormatError, PluginError
from megafmt.tokenizers.base import TokenizerOptions, fingerprint_of, import_library, require_file

#: the character Megatron marks kept spaces with (one unlikely to be in a vocabulary)
SPACE_MARKER = "☯"
#: between two spaces, or a space that starts or ends the text
_KEPT_SPACE = re.compile(r"(?<= )(?= )|^ | $")


class SentencePieceTokenizer:
    name = "sentencepiece"

    def __init__(self, processor: Any, fingerprint: str, keep_extra_spaces: bool) -> None:
        self._processor = processor
        self.vocab_size = processor.get_piece_size()
        eos = processor.eos_id()
        self.eod = eos if eos >= 0 else None
        pad = processor.pad_id()
        self.pad = pad if pad >= 0 else None
        self.fingerprint = fingerprint
        collapses = processor.encode("x  y", out_type=str) == processor.encode("x y", out_type=str)
        self._keep_extra_spaces = keep_extra_spaces and collapses

    @classmethod
    def from_options(cls, options: TokenizerOptions) -> SentencePieceTokenizer:
        sentencepiece: Any = import_library("sentencepiece", cls.name, "sentencepiece")
        path = require_file(options.model, "--tokenizer-model", "the sentencepiece tokenizer")
        if options.special_tokens:
            raise PluginError(
                "--tokenizer-special-tokens with a sentencepiece model: Megatron refuses them "
                "without --tokenizer-sentencepiece-legacy, and its legacy splitting on them is "
                "not supported here"
            )
        try:
            processor = sentencepiece.SentencePieceProcessor(model_file=path)
        except (OSError, RuntimeError) as error:
            raise FormatError(f"{path}: not a SentencePiece model ({error})") from None
        keep = not options.sentencepiece_ignore_extra_whitespaces
        return cls(processor, fingerprint_of(cls.name, [path], keep), keep)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        if not self._keep_extra_spaces:
            return self._processor.encode(list(texts), out_type=int)
        return [self._encode_keeping_spaces(text) for text in texts]

    def _encode_keeping_spaces(self, text: str) -> list[int]:
        marked = _KEPT_SPACE.sub(f" {SPACE_MARKER} ", text).rstrip()
        pieces = [piece + SPACE_MARKER for piece in marked.split(SPACE_MARKER) if piece]
        ids: list[int] = []
        for encoded in self._processor.encode(pieces, out_type=int):
            ids.extend(encoded[:-1])
        return ids

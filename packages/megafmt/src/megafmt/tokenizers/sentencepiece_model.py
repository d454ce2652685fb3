"""``sentencepiece``: a local SentencePiece ``.model``, as Megatron's SentencePieceTokenizer
encodes; a document ends with the model's eos id.

With ``--no-tokenizer-sentencepiece-ignore-extra-whitespaces``, a model that collapses runs of
spaces gets them kept as Megatron keeps them: a marker character is put between neighbouring
spaces and at either end of the text, each piece is encoded with the marker appended and the
marker's id (the last) dropped.

With ``--tokenizer-sentencepiece-legacy``, ``--tokenizer-special-tokens`` are matched in the
text as Megatron's legacy wrapper matches them: the earliest occurrence first (the one given
first on a tie), the text before it encoded (less a leading word separator right after another
special token), then the token's id: its piece id, or a new id after the model's pieces for one
the model lacks. Megatron's legacy wrapper has no end-of-document id (it raises when asked),
so in legacy mode neither has this one.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from megafmt.errors import FormatError, PluginError
from megafmt.tokenizers.base import TokenizerOptions, fingerprint_of, import_library, require_file

#: the character Megatron marks kept spaces with (one unlikely to be in a vocabulary)
SPACE_MARKER = "☯"
#: the piece sentencepiece starts a word with
WORD_SEPARATOR = "▁"
#: between two spaces, or a space that starts or ends the text
_KEPT_SPACE = re.compile(r"(?<= )(?= )|^ | $")


class SentencePieceTokenizer:
    name = "sentencepiece"

    def __init__(
        self,
        processor: Any,
        fingerprint: str,
        keep_extra_spaces: bool,
        legacy: bool = False,
        special_tokens: Sequence[str] = (),
    ) -> None:
        self._processor = processor
        self.vocab_size = processor.get_piece_size()
        eos = processor.eos_id()
        self.eod = eos if eos >= 0 and not legacy else None
        pad = processor.pad_id()
        self.pad = pad if pad >= 0 else None
        self.fingerprint = fingerprint
        collapses = processor.encode("x  y", out_type=str) == processor.encode("x y", out_type=str)
        self._keep_extra_spaces = keep_extra_spaces and collapses
        self._separator = processor.piece_to_id(WORD_SEPARATOR)
        #: special token -> id, in the order given (ties in the text go to the earlier one)
        self._special: dict[str, int] = {}
        unknown = processor.unk_id()
        for token in special_tokens:
            known = processor.piece_to_id(token)
            if known != unknown:
                self._special[token] = known
            elif token not in self._special:
                self._special[token] = self.vocab_size
                self.vocab_size += 1
        self._special_ids = frozenset(self._special.values())

    @classmethod
    def from_options(cls, options: TokenizerOptions) -> SentencePieceTokenizer:
        sentencepiece: Any = import_library("sentencepiece", cls.name, "sentencepiece")
        path = require_file(options.model, "--tokenizer-model", "the sentencepiece tokenizer")
        keep = not options.sentencepiece_ignore_extra_whitespaces
        special = tuple(options.special_tokens or ())
        if special and not options.sentencepiece_legacy:
            raise PluginError(
                "--tokenizer-special-tokens with a sentencepiece model needs "
                "--tokenizer-sentencepiece-legacy (Megatron refuses them without it)"
            )
        if special and keep:
            raise PluginError(
                "--tokenizer-special-tokens with "
                "--no-tokenizer-sentencepiece-ignore-extra-whitespaces is not supported"
            )
        try:
            processor = sentencepiece.SentencePieceProcessor(model_file=path)
        except (OSError, RuntimeError) as error:
            raise FormatError(f"{path}: not a SentencePiece model ({error})") from None
        fingerprint = fingerprint_of(cls.name, [path], keep, special)
        return cls(processor, fingerprint, keep, options.sentencepiece_legacy, special)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        if self._special:
            return [self._encode_around_special_tokens(text) for text in texts]
        if not self._keep_extra_spaces:
            return self._processor.encode(list(texts), out_type=int)
        return [self._encode_keeping_spaces(text) for text in texts]

    def _encode_around_special_tokens(self, text: str) -> list[int]:
        ids: list[int] = []
        start = 0
        while True:
            found = [(text.find(token, start), order, token) for order, token in
                     enumerate(self._special)]  # fmt: skip
            found = [hit for hit in found if hit[0] >= 0]
            if not found:
                break
            at, _, token = min(found)
            before = self._processor.encode(text[start:at], out_type=int)
            if before and ids and ids[-1] in self._special_ids and before[0] == self._separator:
                before = before[1:]
            ids += before
            ids.append(self._special[token])
            start = at + len(token)
        return ids + self._processor.encode(text[start:], out_type=int)

    def _encode_keeping_spaces(self, text: str) -> list[int]:
        marked = _KEPT_SPACE.sub(f" {SPACE_MARKER} ", text).rstrip()
        pieces = [piece + SPACE_MARKER for piece in marked.split(SPACE_MARKER) if piece]
        ids: list[int] = []
        for encoded in self._processor.encode(pieces, out_type=int):
            ids.extend(encoded[:-1])
        return ids

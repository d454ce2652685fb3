"""``tiktoken``: Megatron's TikTokenizer over a local BPE vocabulary, with the ``tiktoken`` package.

The vocabulary is Megatron's JSON list (``rank``, ``token_bytes`` in base64, ``token_str``) or
a plain ``.tiktoken`` file (one ``base64-token rank`` per line). As in Megatron, the first
``--tiktoken-num-special-tokens`` ids (1000) are special tokens (``<unk>``, ``<s>``, ``</s>``,
... then ``<SPECIAL_n>`` fillers), the BPE ranks follow, the vocabulary is cut to
``--vocab-size`` (131072) and a document ends with ``</s>``.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from typing import Any

import numpy

from megafmt.errors import FormatError, PluginError
from megafmt.tokenizers.base import TokenizerOptions, fingerprint_of, import_library, require_file

DEFAULT_VOCAB_SIZE = 2**17
REQUIRED_SPECIAL_TOKENS = ("<unk>", "<s>", "</s>", "<mask>", "<pad>", "<cls>", "<sep>")
EOD_TOKEN = "</s>"
# The pre-tokenization regexes Megatron names v1 and v2: data that decides the ids.
PATTERNS = {
    "v1": r"[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+",
    "v2": (  # Mistral's Tekken
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
        r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
        r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
    ),
}


def read_ranks(path: str) -> list[bytes]:
    """The BPE tokens of the vocabulary file at ``path``, in rank order."""
    with open(path, "rb") as stream:
        raw = stream.read()
    if path.endswith(".json"):
        try:
            entries = json.loads(raw)
            ranked = sorted((int(e["rank"]), base64.b64decode(e["token_bytes"])) for e in entries)
        except (ValueError, KeyError, TypeError) as error:
            raise FormatError(
                f"{path}: expected a JSON list of {{rank, token_bytes, token_str}} ({error})"
            ) from None
    else:
        ranked = []
        for number, line in enumerate(raw.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                token, rank = line.split()
                ranked.append((int(rank), base64.b64decode(token)))
            except ValueError:
                raise FormatError(
                    f"{path}, line {number}: expected 'base64-token rank', found {line[:60]!r}"
                ) from None
        ranked.sort()
    for position, (rank, _) in enumerate(ranked):
        if rank != position:
            raise FormatError(f"{path}: ranks must run 0, 1, 2, ...; rank {position} is {rank}")
    return [token for _, token in ranked]


def shared_character(tokens: Sequence[str]) -> str | None:
    """A character every one of ``tokens`` holds (None if there is none): a text without it
    holds none of them."""
    common = set(tokens[0]) if tokens else set()
    for token in tokens[1:]:
        common &= set(token)
    return min(common) if common else None


class TikTokenTokenizer:
    name = "tiktoken"

    def __init__(
        self,
        encoding: Any,
        vocab_size: int,
        eod: int,
        pad: int,
        fingerprint: str,
        special_tokens: Sequence[str],
    ) -> None:
        self._encoding = encoding
        self.vocab_size = vocab_size
        self.eod = eod
        self.pad = pad
        self.fingerprint = fingerprint
        self._special_mark = shared_character(special_tokens)

    @classmethod
    def from_options(cls, options: TokenizerOptions) -> TikTokenTokenizer:
        tiktoken: Any = import_library("tiktoken", cls.name, "tiktoken")
        path = require_file(options.model, "--tokenizer-model", "the tiktoken tokenizer")
        vocab_size = options.vocab_size or DEFAULT_VOCAB_SIZE
        reserved = options.tiktoken_num_special_tokens
        special = list(options.special_tokens or REQUIRED_SPECIAL_TOKENS)
        missing = [token for token in REQUIRED_SPECIAL_TOKENS if token not in special]
        if missing or len(set(special)) != len(special):
            raise PluginError(
                f"--tokenizer-special-tokens must be distinct and include "
                f"{' '.join(REQUIRED_SPECIAL_TOKENS)}; missing {missing or 'none'}"
            )
        if not len(special) <= reserved < vocab_size:
            raise PluginError(
                f"--tiktoken-num-special-tokens {reserved} must be at least the "
                f"{len(special)} special tokens and below --vocab-size {vocab_size}"
            )
        pattern = options.tiktoken_pattern or "v2"
        if pattern not in PATTERNS:
            raise PluginError(
                f"--tiktoken-pattern must be v1 or v2, found {options.tiktoken_pattern!r}"
            )
        special += [f"<SPECIAL_{i}>" for i in range(len(special), reserved)]
        tokens = read_ranks(path)[: vocab_size - reserved]
        if len(tokens) != vocab_size - reserved:
            raise FormatError(
                f"{path}: {len(tokens)} BPE tokens, but --vocab-size {vocab_size} less "
                f"{reserved} special tokens needs {vocab_size - reserved}"
            )
        encoding = tiktoken.Encoding(
            name="megafmt",
            pat_str=PATTERNS[pattern],
            mergeable_ranks={token: reserved + rank for rank, token in enumerate(tokens)},
            special_tokens={token: rank for rank, token in enumerate(special)},
        )
        fingerprint = fingerprint_of(cls.name, [path], vocab_size, reserved, special, pattern)
        eod, pad = special.index(EOD_TOKEN), special.index("<pad>")
        return cls(encoding, vocab_size, eod, pad, fingerprint, special)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Megatron's ``encode(text, allowed_special="all")`` of each text."""
        return [ids.tolist() for ids in self.encode_batch_arrays(texts)]

    def encode_batch_arrays(self, texts: Sequence[str]) -> list[numpy.ndarray]:
        """``encode_batch`` as arrays, straight from the library's buffer."""
        return [self._encode_array(text) for text in texts]

    def _encode_array(self, text: str) -> numpy.ndarray:
        """Megatron's ids of ``text``. A text without the character every special token holds
        can hold no special token, and for it Megatron's call equals one that allows none,
        which skips building the set of the (by default 1000) special tokens: several times
        faster on short documents. A text that is not UTF-8 (a lone surrogate) takes
        Megatron's call itself, which mends it as Megatron's does."""
        mark = self._special_mark
        try:
            if mark is not None and mark not in text:
                return self._encoding.encode_to_numpy(text, disallowed_special=())
            return self._encoding.encode_to_numpy(text, allowed_special="all")
        except UnicodeEncodeError:
            ids = self._encoding.encode(text, allowed_special="all")
            return numpy.array(ids, dtype=numpy.uint32)

"""``tiktoken``: Megatron's TikTokenizer over a local BPE vocabulary, with the ``tiktoken`` package.

The vocabulary is Megatron's JSON list (``rank``, ``token_bytes`` in base64, ``token_str``) or
a plain ``.tiktoken`` file (one ``base64-token rank`` per line). As in Megatron, the first
``--tiktoken-num-special-tokens`` ids (1000) are special tokens (``<unk>``, ``<s>``, ``</s>``,
... then ``<SPECIAL_n>`` fillers), the BPE ranks follow, the vocabulary is cut to
``--vocab-size`` (131072) and a document ends with ``</s>``.
"""

from __future__ import annotations

import base64
import functools
import json
import os
import tempfile
from collections.abc import Sequence
from typing import Any

import numpy

from megafmt.errors import FormatError, PluginError
from megafmt.tokenizers.base import TokenizerOptions, fingerprint_of, import_library, require_file
from megafmt.tokenizers.fast_backend import AUTO, BackendChoice, GigatokenEncoder, choose_backend

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


#: gigatoken's pre-tokenizer scheme equal to each of Megatron's patterns (v1 has none)
GIGATOKEN_SCHEMES = {"v2": "nemotron"}
#: the special tokens the backend's stress sample puts beside text: the named ones and a few
#: of the fillers
STRESSED_FILLERS = 3


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
        ranks: Sequence[bytes] = (),
        pattern: str = "v2",
        backend: str = AUTO,
    ) -> None:
        self._encoding = encoding
        self._special_tokens = list(special_tokens)
        self._ranks = ranks
        self._pattern = pattern
        self._backend = backend
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
        return cls(
            encoding, vocab_size, eod, pad, fingerprint, special, tokens, pattern, options.backend
        )

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Megatron's ``encode(text, allowed_special="all")`` of each text."""
        return [ids.tolist() for ids in self.encode_batch_arrays(texts)]

    def encode_batch_arrays(
        self, texts: Sequence[str], parallel: bool | None = None
    ) -> list[numpy.ndarray]:
        """``encode_batch`` as arrays, straight from the library's buffer: gigatoken's where its
        self-check passed, else tiktoken's (and tiktoken's for a batch holding a text that is
        not UTF-8, which gigatoken refuses and tiktoken mends)."""
        fast = self._checked_backend[0]
        if fast is not None:
            try:
                return fast.encode_batch_arrays(texts, parallel)
            except TypeError:
                pass
        return [self._encode_array(text) for text in texts]

    def flat_encoder(self) -> GigatokenEncoder | None:
        """gigatoken's encoder, where its self-check passed: it takes a block of texts in one
        buffer (preprocessing's block path)."""
        return self._checked_backend[0]

    @property
    def backend_choice(self) -> BackendChoice:
        """Which library encodes, and why (:mod:`megafmt.tokenizers.fast_backend`)."""
        return self._checked_backend[1]

    @functools.cached_property
    def _checked_backend(self) -> tuple[GigatokenEncoder | None, BackendChoice]:
        """gigatoken's encoder if it passes the check on this vocabulary, and the choice."""
        named = self._special_tokens[: len(REQUIRED_SPECIAL_TOKENS)]
        stressed = [*named, *self._special_tokens[len(named) :][:STRESSED_FILLERS]]

        def reference(texts: list[str]) -> list[list[int]]:
            return [self._encode_array(text).tolist() for text in texts]

        return choose_backend(
            self._backend, self._gigatoken, reference, stressed, self.fingerprint, "tiktoken"
        )

    def _gigatoken(self) -> GigatokenEncoder:
        """gigatoken's encoder of this vocabulary: the ranks from 0 in a .tiktoken file, the
        special tokens after them, renumbered to Megatron's ids (special tokens first)."""
        scheme = GIGATOKEN_SCHEMES.get(self._pattern)
        if scheme is None:
            raise ValueError(f"it has no pre-tokenizer for --tiktoken-pattern {self._pattern}")
        gigatoken: Any = __import__("gigatoken")
        count, reserved = len(self._ranks), len(self._special_tokens)
        with tempfile.TemporaryDirectory(prefix="megafmt-tiktoken-") as folder:
            path = os.path.join(folder, "ranks.tiktoken")
            with open(path, "wb") as stream:
                stream.writelines(
                    base64.b64encode(token) + b" %d\n" % rank
                    for rank, token in enumerate(self._ranks)
                )
            specials = {token: count + n for n, token in enumerate(self._special_tokens)}
            tokenizer = gigatoken.Tokenizer.from_tiktoken(path, scheme, specials)
        renumber = numpy.concatenate(
            [numpy.arange(reserved, reserved + count), numpy.arange(reserved)]
        ).astype(numpy.uint32)
        return GigatokenEncoder(tokenizer, renumber=renumber)

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

"""``huggingface``: a local tokenizer.json through the ``tokenizers`` package, or GPT-2 style
``--vocab-file``/``--merge-file`` (Megatron's GPT2BPETokenizer).

Ids equal Megatron's HuggingFaceTokenizer: the tokenizer.json's special tokens (a BOS, say) are
added to every text as the seed commit adds them, unless ``include_special_tokens`` is off (the
default of ``compat="0.16.1"``); ``--tokenizer-special-tokens`` are added to the vocabulary as
special tokens, the ones not in it with the next ids. The end-of-document token is the
``eos_token`` of the tokenizer_config.json or special_tokens_map.json beside the tokenizer.json
(the ``sep_token`` when there is no eos), as transformers reads it; GPT-2 files end documents
with ``<|endoftext|>``.

It is also a :class:`~megafmt.protocols.TextTokenizer` (what fill-in-the-middle and decoding
ask): ids back to text as Megatron's HuggingFaceTokenizer gives them over transformers, whose
special tokens are the ones the config files declare (named, plus ``extra_special_tokens`` or
``additional_special_tokens``), not every added token of the tokenizer.json.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from collections.abc import Sequence
from typing import Any

import numpy

from megafmt.errors import FormatError, MissingFileError, PluginError
from megafmt.tokenizers.base import TokenizerOptions, fingerprint_of, import_library, require_file
from megafmt.tokenizers.fast_backend import (
    AUTO,
    BackendChoice,
    GigatokenEncoder,
    choose_backend,
    fixed_ids,
)

GPT2_EOD = "<|endoftext|>"
CONFIG_FILES = ("tokenizer_config.json", "special_tokens_map.json")


def _token_text(value: Any) -> str | None:
    """A special token as the config files write it: a string or ``{"content": ...}``."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


#: the special tokens transformers names (its SPECIAL_TOKENS_ATTRIBUTES), eos first: the eod
NAMED_SPECIAL_TOKENS = (
    "eos_token",
    "sep_token",
    "bos_token",
    "unk_token",
    "pad_token",
    "cls_token",
    "mask_token",
)
#: the order transformers adds the named special tokens to the vocabulary in
TRANSFORMERS_ORDER = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)
#: the keys of the further special tokens (transformers 5 reads the older name as the newer)
EXTRA_SPECIAL_TOKENS = ("extra_special_tokens", "additional_special_tokens")


def configured_tokens(directory: str) -> tuple[dict[str, str], list[str], list[str]]:
    """The special tokens the config files in ``directory`` declare, as transformers reads
    them (the first file naming one wins): the named ones by key, the further ones (the
    first list found), and the files."""
    named: dict[str, str] = {}
    extra: list[str] | None = None
    files = []
    for name in CONFIG_FILES:
        path = os.path.join(directory, name)
        if not os.path.isfile(path):
            continue
        files.append(path)
        try:
            with open(path, encoding="utf-8") as stream:
                config = json.load(stream)
        except (ValueError, UnicodeDecodeError) as error:
            raise FormatError(f"{path}: not valid JSON ({error})") from None
        if not isinstance(config, dict):
            continue
        for key in NAMED_SPECIAL_TOKENS:
            token = _token_text(config.get(key))
            if token is not None:
                named.setdefault(key, token)
        for key in EXTRA_SPECIAL_TOKENS:
            if extra is None and isinstance(config.get(key), list):
                extra = [t for t in map(_token_text, config[key]) if t is not None]
    return named, extra or [], files


#: the named special tokens Megatron's HuggingFaceTokenizer sets from another when the config
#: lacks them (sep from eos, eos from sep, bos from cls, cls from bos)
STAND_INS = (
    ("sep_token", "eos_token"),
    ("eos_token", "sep_token"),
    ("bos_token", "cls_token"),
    ("cls_token", "bos_token"),
)


def readded_tokens(named: dict[str, str]) -> list[str]:
    """The declared special tokens Megatron's HuggingFaceTokenizer hands to transformers'
    ``add_special_tokens`` again as plain strings (a missing sep is the eos, a missing cls the
    bos, and the other way round), which resets their lstrip / rstrip / single_word flags."""
    return [
        named[source] for target, source in STAND_INS if target not in named and source in named
    ]


class HuggingFaceTokenizer:
    name = "huggingface"

    def __init__(
        self,
        tokenizer: Any,
        eod_token: str | None,
        files: list[str],
        special: bool = False,
        special_tokens: Sequence[str] = (),
        pad_token: str | None = None,
        added_tokens: Sequence[str] = (),
        backend: str = AUTO,
        readded_tokens: Sequence[str] = (),
    ) -> None:
        present = {token.content for token in tokenizer.get_added_tokens_decoder().values()}
        new = [token for token in added_tokens if token not in present]
        if new:
            # transformers adds the declared tokens the tokenizer.json lacks, Megatron then
            # --tokenizer-special-tokens: the ones not in the vocabulary get the next ids; a
            # token the tokenizer.json already adds keeps its own flags (lstrip, rstrip, ...)
            tokenizer.add_special_tokens(new)
        if readded_tokens:
            # ... except those Megatron hands to add_special_tokens again as plain strings:
            # they lose their flags (see readded_tokens)
            tokenizer.add_special_tokens(list(readded_tokens))
        self._backend = backend
        self._tokenizer = tokenizer
        self._special = special
        self._special_tokens = frozenset(special_tokens)
        self._tokens: _TokenTable | None = None  # built on the first ids_to_text
        self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
        self.eod = None
        if eod_token is not None:
            self.eod = tokenizer.token_to_id(eod_token)
            if self.eod is None:
                raise FormatError(
                    f"{files[0]}: the end-of-document token {eod_token!r} is not in the vocabulary"
                )
        self.pad = None if pad_token is None else tokenizer.token_to_id(pad_token)
        self.fingerprint = fingerprint_of(self.name, files, eod_token, special, list(added_tokens))
        self._encode = getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)

    @classmethod
    def from_options(cls, options: TokenizerOptions) -> HuggingFaceTokenizer:
        tokenizers: Any = import_library("tokenizers", cls.name, "tokenizers")
        if options.vocab_file or options.merge_file:
            return cls._from_gpt2_files(tokenizers, options)
        if not options.model:
            raise PluginError(
                "the huggingface tokenizer needs --tokenizer-model (a tokenizer.json or its "
                "directory) or --vocab-file and --merge-file"
            )
        path = options.model
        if os.path.isdir(path):
            path = os.path.join(path, "tokenizer.json")
            if not os.path.isfile(path):
                raise MissingFileError(
                    f"--tokenizer-model {options.model}: the directory holds no tokenizer.json"
                )
        path = require_file(path, "--tokenizer-model", "the huggingface tokenizer")
        try:
            tokenizer = tokenizers.Tokenizer.from_file(path)
        except Exception as error:  # the Rust side raises plain Exception
            raise FormatError(f"{path}: not a tokenizers tokenizer.json ({error})") from None
        named, extra, configs = configured_tokens(os.path.dirname(os.path.abspath(path)))
        eod_token = named.get("eos_token", named.get("sep_token"))
        # transformers makes every token the config files declare special (one id wherever the
        # text holds it; new ids for those not in the vocabulary), named ones first in its
        # order; Megatron then adds --tokenizer-special-tokens
        declared = [named[key] for key in TRANSFORMERS_ORDER if key in named]
        added = list(dict.fromkeys([*declared, *extra, *(options.special_tokens or ())]))
        readded = [*readded_tokens(named), *(options.special_tokens or ())]
        return cls(
            tokenizer,
            eod_token,
            [path, *configs],
            options.adds_special_tokens,
            added,
            named.get("pad_token"),
            added,
            options.backend,
            readded,
        )

    @classmethod
    def _from_gpt2_files(cls, tokenizers: Any, options: TokenizerOptions) -> HuggingFaceTokenizer:
        vocab = require_file(options.vocab_file, "--vocab-file", "GPT-2 BPE")
        merges = require_file(options.merge_file, "--merge-file", "GPT-2 BPE")
        try:
            model = tokenizers.models.BPE.from_file(vocab, merges)
        except Exception as error:  # the Rust side raises plain Exception
            raise FormatError(f"{vocab}, {merges}: not GPT-2 BPE files ({error})") from None
        tokenizer = tokenizers.Tokenizer(model)
        tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = tokenizers.decoders.ByteLevel()
        # transformers' GPT2Tokenizer makes <|endoftext|> (its bos, eos and unk) a special
        # token: one id wherever the text holds it
        added = [GPT2_EOD, *(options.special_tokens or ())]
        return cls(
            tokenizer,
            GPT2_EOD,
            [vocab, merges],
            options.adds_special_tokens,
            added,
            added_tokens=added,
            backend=options.backend,
        )

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """The ids of each text (Megatron's ``tokenize``)."""
        if self._fast is None:
            encodings = self._encode(list(texts), add_special_tokens=self._special)
            return [encoding.ids for encoding in encodings]
        return [ids.tolist() for ids in self._fast.encode_batch_arrays(texts)]

    def encode_batch_arrays(
        self, texts: Sequence[str], parallel: bool | None = None
    ) -> list[numpy.ndarray]:
        """``encode_batch`` as arrays: gigatoken's buffer cut per text, where it is exact
        (``parallel`` as gigatoken takes it). The ``tokenizers`` library's pool otherwise: it
        turns itself off in a process forked after its use."""
        if self._fast is None:
            return [numpy.asarray(ids, dtype=numpy.int64) for ids in self.encode_batch(texts)]
        return self._fast.encode_batch_arrays(texts, parallel)

    def flat_encoder(self) -> GigatokenEncoder | None:
        """gigatoken's encoder, where its self-check passed: it takes a block of texts in one
        buffer (preprocessing's block path)."""
        return self._fast

    @property
    def backend_choice(self) -> BackendChoice:
        """Which library encodes, and why (checked on the first call: see
        :mod:`megafmt.tokenizers.fast_backend`)."""
        return self._checked_backend[1]

    @property
    def _fast(self) -> GigatokenEncoder | None:
        return self._checked_backend[0]

    @functools.cached_property
    def _checked_backend(self) -> tuple[GigatokenEncoder | None, BackendChoice]:
        """gigatoken's encoder if it passes the check on this tokenizer, and the choice: made
        on the first encoding, so that a tokenizer loaded only to decode does not pay it."""
        description = self._tokenizer.to_str()
        config = json.loads(description)
        around = fixed_ids(config.get("post_processor")) if self._special else ([], [])

        def build() -> GigatokenEncoder:
            if around is None:
                raise ValueError(
                    f"a {config['post_processor'].get('type')} post-processor adds more than "
                    "fixed ids"
                )
            return GigatokenEncoder.from_json(description, *around)

        def reference(texts: list[str]) -> list[list[int]]:
            encode = self._tokenizer.encode  # one by one: no thread pool (see choose_backend)
            return [encode(text, add_special_tokens=self._special).ids for text in texts]

        added = [token.content for token in self._tokenizer.get_added_tokens_decoder().values()]
        digest = hashlib.sha256(f"{self._special}:{description}".encode()).hexdigest()
        return choose_backend(self._backend, build, reference, added, digest)

    # ---- Megatron's library tokenizer methods (megafmt.protocols.TextTokenizer) --------------

    def tokens_to_ids(self, tokens: Sequence[str]) -> list[int | None]:
        """The id of each token string (None for one not in the vocabulary)."""
        return [self._tokenizer.token_to_id(token) for token in tokens]

    def text_to_ids(self, text: str) -> list[int]:
        """The ids of ``text``, special tokens added only if the options asked for them:
        through gigatoken where its self-check passed (fill-in-the-middle encodes three pieces
        of every rearranged sample), else the library."""
        if self._fast is None:
            return self._tokenizer.encode(text, add_special_tokens=self._special).ids
        return self._fast.encode_array(text).tolist()

    def ids_to_text(self, ids: Sequence[int], remove_special_tokens: bool = True) -> str:
        """The text of ``ids`` as Megatron's HuggingFaceTokenizer gives it over transformers:
        the tokens of the ids (unknown ids dropped; with ``remove_special_tokens`` the special
        tokens the config files declare too) joined by the tokenizer's decoder."""
        if self._tokens is None:
            self._tokens = _TokenTable(self._tokenizer, self._special_tokens)
        kept = self._tokens.strings(ids, remove_special_tokens)
        decoder = self._tokenizer.decoder
        return " ".join(kept) if decoder is None else decoder.decode(kept)


class _TokenTable:
    """Every id's token string in one array, looked up for a whole sequence of ids at once (a
    sample's thousands of ids cost one numpy gather, not one library call each)."""

    def __init__(self, tokenizer: Any, special_tokens: frozenset[str]) -> None:
        vocab = tokenizer.get_vocab(with_added_tokens=True)
        size = max(vocab.values(), default=-1) + 1
        self.table = numpy.empty(size, dtype=object)
        self.known = numpy.zeros(size, dtype=bool)
        self.plain = numpy.zeros(size, dtype=bool)
        for token, index in vocab.items():
            self.table[index] = token
            self.known[index] = True
            self.plain[index] = token not in special_tokens

    def strings(self, ids: Sequence[int], remove_special_tokens: bool) -> list[str]:
        """The token strings of ``ids``, ids without one (or special, if asked) left out."""
        ids = numpy.asarray(ids, dtype=numpy.int64)
        ids = ids[(ids >= 0) & (ids < len(self.table))]
        wanted = self.plain if remove_special_tokens else self.known
        return self.table[ids[wanted[ids]]].tolist()

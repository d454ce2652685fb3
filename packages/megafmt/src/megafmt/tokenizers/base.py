"""What a tokenizer plugin is: the options it is built from and the few things preprocessing asks
of it.

A plugin is a class in the entry-point group ``megafmt.tokenizers`` with a ``from_options``
class method. Tokenizers are built inside each worker process from the same options (they are
not pickled), and every one of them encodes a whole batch of texts per call: batching is where
the Rust and C++ tokenizer libraries win their speed.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy

from megafmt.errors import MissingFileError, PluginError
from megafmt.tokenizers.fast_backend import AUTO, BACKENDS, BackendChoice

#: the two Megatron releases whose tokenizers differ: the seed commit (the default) and the
#: megatron-core 0.16.1 release
SEED = "seed"
CORE_0_16 = "0.16.1"
COMPATS = (SEED, CORE_0_16)


@dataclass(frozen=True)
class TokenizerOptions:
    """The tokenizer flags of Megatron's preprocess_data.py (its ``_add_tokenizer_args``), with
    their meanings and the defaults of Megatron-LM at the seed commit."""

    model: str | None = None
    """``--tokenizer-model``: a tokenizer.json (or its directory), a .model, a tiktoken vocab."""
    vocab_file: str | None = None
    """``--vocab-file``: GPT-2 style vocab.json (with ``merge_file``)."""
    merge_file: str | None = None
    """``--merge-file``: GPT-2 style merges.txt."""
    vocab_size: int | None = None
    """``--vocab-size``: the null tokenizer's vocabulary, tiktoken's total size."""
    special_tokens: tuple[str, ...] | None = None
    """``--tokenizer-special-tokens`` (None when not given: Megatron tells the two apart)."""
    tiktoken_pattern: str | None = None
    """``--tiktoken-pattern``: v1 or v2, the pre-tokenization regex (None: v2, unrecorded)."""
    tiktoken_num_special_tokens: int = 1000
    """``--tiktoken-num-special-tokens``: ids below this are special tokens."""
    include_special_tokens: bool | None = None
    """Whether a tokenizer.json adds its special tokens (a BOS, say) to every text: the seed
    commit does unless ``--tokenizer-hf-no-include-special-tokens``; megatron-core 0.16.1 only
    with ``--tokenizer-hf-include-special-tokens``. None: the ``compat`` release's default."""
    use_fast: bool | None = None
    """The seed commit's default unless ``--tokenizer-hf-no-use-fast``; 0.16.1's only with
    ``--tokenizer-hf-use-fast``. Recorded in the identity; the ``tokenizers`` package is the
    fast implementation, so the ids are the fast tokenizer's either way."""
    trust_remote_code: bool = False
    """``--trust-remote-code``: recorded in the identity; no code is fetched or run here."""
    chat_template: str | None = None
    """``--chat-template``: recorded in the identity (preprocessing applies no template)."""
    metadata_path: str | None = None
    """``--tokenizer-metadata``: Megatron's tokenizer_metadata.json; its ``model_type`` picks
    the Megatron tokenizer class the identity names."""
    sentencepiece_legacy: bool = False
    """``--tokenizer-sentencepiece-legacy``: special tokens matched inside the text."""
    sentencepiece_ignore_extra_whitespaces: bool = True
    """``--tokenizer-sentencepiece-ignore-extra-whitespaces`` (the default)."""
    null_eod_id: int | None = None
    """``--null-tokenizer-eod-id``: the null tokenizer's EOD (default ``vocab_size - 1``)."""
    null_pad_id: int = -1
    """``--null-tokenizer-pad-id``: the null tokenizer's pad id (-1: none)."""
    compat: str = SEED
    """Whose defaults and identities: ``seed`` (Megatron-LM at the seed commit) or ``0.16.1``
    (megatron-core 0.16.1: NullTokenizer EOD = vocab size, no special tokens added)."""
    extra: dict[str, str] = field(default_factory=dict)
    """Settings of third-party plugins (``--tokenizer-option KEY=VALUE``)."""
    backend: str = AUTO
    """``--tokenizer-backend``: which library encodes a tokenizer.json: ``auto`` (gigatoken
    where its self-check on this tokenizer passes, else the ``tokenizers`` library),
    ``gigatoken`` (an error where the check fails) or ``reference`` (``tokenizers``). The ids
    are the same; only the speed differs."""

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise PluginError(
                f"tokenizer backend must be one of {', '.join(BACKENDS)}, found {self.backend!r}"
            )
        if self.compat not in COMPATS:
            raise PluginError(
                f"tokenizer compat must be one of {', '.join(COMPATS)}, found {self.compat!r}"
            )

    def _or_default(self, value: bool | None) -> bool:
        """``value`` as given, else the release's default (on at the seed commit, off in
        0.16.1: both releases flipped the two HuggingFace switches together)."""
        return self.compat == SEED if value is None else value

    @property
    def adds_special_tokens(self) -> bool:
        """Whether text gets the tokenizer's special tokens, the release's default applied."""
        return self._or_default(self.include_special_tokens)

    @property
    def uses_fast(self) -> bool:
        """Whether the fast HuggingFace tokenizer is asked for, the release's default applied."""
        return self._or_default(self.use_fast)


@runtime_checkable
class Tokenizer(Protocol):
    """A tokenizer as preprocessing sees it."""

    name: str
    """The plugin name (``huggingface``) the manifest records."""
    vocab_size: int
    """Megatron's ``tokenizer.vocab_size``: it picks the output dtype."""
    eod: int | None
    """The end-of-document id ``--append-eod`` appends; None when the tokenizer has none."""
    pad: int | None
    """Megatron's ``tokenizer.pad`` (GPTDataset masks labels equal to it); None for none."""
    fingerprint: str
    """A digest of the files and settings that decide the ids: equal fingerprints, equal ids."""

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """The ids of each text, special tokens not added (Megatron's ``tokenize``)."""
        ...


@runtime_checkable
class ArrayTokenizer(Protocol):
    """A tokenizer that can also give each text's ids as a numpy array: preprocessing then
    never makes a Python int per token (the library's buffer becomes the array)."""

    def encode_batch_arrays(
        self, texts: Sequence[str], parallel: bool | None = None
    ) -> list[numpy.ndarray]:
        """The ids of each text, as ``encode_batch`` gives them, as 1-D integer arrays;
        ``parallel``: whether a library with a thread pool of its own may use it (None: it
        decides; False: this process encodes on one core, and forks workers later)."""
        ...


@runtime_checkable
class FlatEncoder(Protocol):
    """An encoder of a whole block of texts in one call, giving one flat array back."""

    def encode_flat(
        self, texts: Any, parallel: bool | None = None
    ) -> tuple[numpy.ndarray, numpy.ndarray]:
        """The ids of all ``texts`` (an awkward array of strings) back to back, and how many
        ids each text has; ``parallel``: whether the library may use its thread pool (None:
        it decides)."""
        ...


@runtime_checkable
class BlockTokenizer(Protocol):
    """A tokenizer that can encode a block of texts held in one UTF-8 buffer in one call
    (preprocessing's block path, :mod:`megafmt.preprocess.blocks`)."""

    def flat_encoder(self) -> FlatEncoder | None:
        """The encoder of such blocks, or None where this tokenizer's chosen library encodes
        text by text (its ids then come through ``encode_batch``)."""
        ...


@runtime_checkable
class ChoosesBackend(Protocol):
    """A tokenizer that chooses the library it encodes with by checking that library on itself
    (:mod:`megafmt.tokenizers.fast_backend`)."""

    @property
    def backend_choice(self) -> BackendChoice:
        """The library, and why (one line)."""
        ...


def require_file(path: str | None, flag: str, what: str) -> str:
    """``path`` if it names an existing file, else an error that says which flag to give."""
    if not path:
        raise PluginError(f"{what} needs {flag}")
    if not os.path.isfile(path):
        raise MissingFileError(f"{flag} {path}: file not found ({what})")
    return path


def fingerprint_of(name: str, files: Sequence[str], *settings: object) -> str:
    """sha256 over the plugin name, the bytes of ``files`` and ``settings``."""
    digest = hashlib.sha256(name.encode())
    for path in files:
        with open(path, "rb") as stream:
            for block in iter(lambda: stream.read(1 << 20), b""):
                digest.update(block)
    digest.update(repr(settings).encode())
    return "sha256:" + digest.hexdigest()


def import_library(module: str, plugin: str, package: str) -> object:
    """Import ``module`` for ``plugin``, or say which package to install."""
    try:
        return __import__(module)
    except ImportError:
        raise PluginError(
            f"tokenizer {plugin!r} needs the {package!r} package: pip install {package}"
        ) from None

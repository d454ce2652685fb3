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
from typing import Protocol

from megafmt.errors import MissingFileError, PluginError


@dataclass(frozen=True)
class TokenizerOptions:
    """The tokenizer flags of Megatron's preprocess_data.py, with their meanings."""

    model: str | None = None
    """``--tokenizer-model``: a tokenizer.json (or its directory), a .model, a tiktoken vocab."""
    vocab_file: str | None = None
    """``--vocab-file``: GPT-2 style vocab.json (with ``merge_file``)."""
    merge_file: str | None = None
    """``--merge-file``: GPT-2 style merges.txt."""
    vocab_size: int | None = None
    """``--vocab-size``: the null tokenizer's vocabulary (its EOD id), tiktoken's total size."""
    special_tokens: tuple[str, ...] = ()
    """``--tokenizer-special-tokens``."""
    tiktoken_pattern: str = "v2"
    """``--tiktoken-pattern``: v1 or v2, the pre-tokenization regex."""
    tiktoken_num_special_tokens: int = 1000
    """``--tiktoken-num-special-tokens``: ids below this are special tokens."""
    include_special_tokens: bool = False
    """``--tokenizer-hf-include-special-tokens``: let a tokenizer.json add its special tokens
    (a BOS, say) to every text."""
    extra: dict[str, str] = field(default_factory=dict)
    """Settings of third-party plugins (``--tokenizer-option KEY=VALUE``)."""


class Tokenizer(Protocol):
    """A tokenizer as preprocessing sees it."""

    name: str
    """The plugin name (``huggingface``) the manifest records."""
    vocab_size: int
    """Megatron's ``tokenizer.vocab_size``: it picks the output dtype."""
    eod: int | None
    """The end-of-document id ``--append-eod`` appends; None when the tokenizer has none."""
    fingerprint: str
    """A digest of the files and settings that decide the ids: equal fingerprints, equal ids."""

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """The ids of each text, special tokens not added (Megatron's ``tokenize``)."""
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

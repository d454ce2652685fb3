"""Tokenizers for ``mega preprocess``, as plugins in the entry-point group ``megafmt.tokenizers``.

Built in: ``bytes`` (no files; the default for demos and tests), ``null``, ``huggingface``,
``tiktoken`` and ``sentencepiece``; the last three import their library only when chosen.
Megatron's ``--tokenizer-type`` values are accepted as aliases, so its command lines work
unchanged.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import TextIO

from megafmt.errors import PluginError
from megafmt.protocols import TextTokenizer
from megafmt.registry import Registry
from megafmt.tokenizers.base import ChoosesBackend, Tokenizer, TokenizerOptions
from megafmt.tokenizers.fast_backend import AUTO, BackendChoice

TOKENIZERS: Registry[type] = Registry(
    "megafmt.tokenizers",
    "tokenizer",
    required=("from_options",),
    home="megafmt",
)

#: Megatron's --tokenizer-type values and the plugin each one means
MEGATRON_ALIASES = {
    "NullTokenizer": "null",
    "HuggingFaceTokenizer": "huggingface",
    "GPT2BPETokenizer": "huggingface",
    "TikTokenizer": "tiktoken",
    "SentencePieceTokenizer": "sentencepiece",
    "GPTSentencePieceTokenizer": "sentencepiece",
    "Llama2Tokenizer": "sentencepiece",
}


def plugin_name(tokenizer_type: str) -> str:
    """The plugin a ``--tokenizer-type`` value names (a plugin name or a Megatron alias)."""
    return MEGATRON_ALIASES.get(tokenizer_type, tokenizer_type)


def load_tokenizer(tokenizer_type: str, options: TokenizerOptions) -> Tokenizer:
    """Build the tokenizer ``tokenizer_type`` names from ``options``."""
    name = plugin_name(tokenizer_type)
    tokenizer = TOKENIZERS.get(name).from_options(options)
    if not isinstance(tokenizer, Tokenizer):  # a third-party plugin missing a member
        members = (*Tokenizer.__annotations__, "encode_batch")
        missing = [member for member in members if not hasattr(tokenizer, member)]
        raise PluginError(
            f"the {name} tokenizer plugin built a {type(tokenizer).__qualname__}, which lacks "
            f"{', '.join(missing)} of megafmt.tokenizers.Tokenizer"
        )
    return tokenizer


def checked_backend(tokenizer: Tokenizer) -> BackendChoice | None:
    """The library ``tokenizer`` encodes with, its self-check run now if not yet in this
    process (the workers a run forks after this inherit the verdict, and do not check again);
    None for a tokenizer with one library only. Raises ``PluginError`` where the gigatoken
    backend was asked for and the check fails."""
    return tokenizer.backend_choice if isinstance(tokenizer, ChoosesBackend) else None


def with_checked_backend(
    tokenizer_type: str, options: TokenizerOptions, stream: TextIO | None = None
) -> TokenizerOptions:
    """``options`` with the library the ``auto`` backend's self-check chose for this tokenizer
    (:mod:`megafmt.tokenizers.fast_backend`), said in one line on ``stream`` (stderr): a run
    checks once, and its workers build the chosen one. Other options come back as they are."""
    if options.backend != AUTO:
        return options
    choice = checked_backend(load_tokenizer(tokenizer_type, options))
    if choice is None:
        return options
    print(f"tokenizer backend: {choice.reason}", file=stream or sys.stderr)
    return dataclasses.replace(options, backend=choice.backend)


def load_text_tokenizer(tokenizer_type: str, options: TokenizerOptions) -> TextTokenizer:
    """Build a tokenizer that also turns ids back into text (for decoding and FIM)."""
    tokenizer = load_tokenizer(tokenizer_type, options)
    if not isinstance(tokenizer, TextTokenizer):
        raise PluginError(
            f"the {plugin_name(tokenizer_type)} tokenizer cannot turn ids into text (it is no "
            "megafmt.protocols.TextTokenizer); use --tokenizer-type huggingface"
        )
    return tokenizer


__all__ = [
    "MEGATRON_ALIASES",
    "TOKENIZERS",
    "TextTokenizer",
    "Tokenizer",
    "TokenizerOptions",
    "checked_backend",
    "load_text_tokenizer",
    "load_tokenizer",
    "plugin_name",
    "with_checked_backend",
]

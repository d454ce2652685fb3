"""Tokenizers for ``mega preprocess``, as plugins in the entry-point group ``megafmt.tokenizers``.

Built in: ``bytes`` (no files; the default for demos and tests), ``null``, ``huggingface``,
``tiktoken`` and ``sentencepiece``; the last three import their library only when chosen.
Megatron's ``--tokenizer-type`` values are accepted as aliases, so its command lines work
unchanged.
"""

from __future__ import annotations

from megafmt.registry import Registry
from megafmt.tokenizers.base import TextTokenizer, Tokenizer, TokenizerOptions

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
    return TOKENIZERS.get(plugin_name(tokenizer_type)).from_options(options)


__all__ = [
    "MEGATRON_ALIASES",
    "TOKENIZERS",
    "TextTokenizer",
    "Tokenizer",
    "TokenizerOptions",
    "load_tokenizer",
    "plugin_name",
]

"""``huggingface``: a local tokenizer.json through the ``tokenizers`` package, or GPT-2 style
``--vocab-file``/``--merge-file`` (Megatron's GPT2BPETokenizer).

Ids equal Megatron's HuggingFaceTokenizer with its defaults (no special tokens added to the
text). The end-of-document token is the ``eos_token`` of the tokenizer_config.json or
special_tokens_map.json beside the tokenizer.json (the ``sep_token`` when there is no eos), as
transformers reads it; GPT-2 files end documents with ``<|endoftext|>``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

from megafmt.errors import FormatError, MissingFileError, PluginError
from megafmt.tokenizers.base import TokenizerOptions, fingerprint_of, import_library, require_file

GPT2_EOD = "<|endoftext|>"
CONFIG_FILES = ("tokenizer_config.json", "special_tokens_map.json")


def _token_text(value: Any) -> str | None:
    """A special token as the config files write it: a string or ``{"content": ...}``."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def configured_tokens(directory: str) -> tuple[dict[str, str], list[str]]:
    """The special tokens (``eos_token``, ``pad_token``, ...) the config files in ``directory``
    name, the first file naming each winning as in transformers, and those files."""
    found: dict[str, str] = {}
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
        for key, value in config.items() if isinstance(config, dict) else ():
            token = _token_text(value) if key.endswith("_token") else None
            if token is not None:
                found.setdefault(key, token)
    return found, files


def _configured_eod(directory: str) -> tuple[str | None, list[str]]:
    """The eos (else sep) token named by the config files in ``directory``, and those files."""
    found, files = configured_tokens(directory)
    return found.get("eos_token", found.get("sep_token")), files


class HuggingFaceTokenizer:
    name = "huggingface"

    def __init__(
        self, tokenizer: Any, eod_token: str | None, files: list[str], special: bool = False
    ) -> None:
        self._tokenizer = tokenizer
        self._special = special
        self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
        self.eod = None
        if eod_token is not None:
            self.eod = tokenizer.token_to_id(eod_token)
            if self.eod is None:
                raise FormatError(
                    f"{files[0]}: the end-of-document token {eod_token!r} is not in the vocabulary"
                )
        self.fingerprint = fingerprint_of(self.name, files, eod_token, special)
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
        eod_token, configs = _configured_eod(os.path.dirname(os.path.abspath(path)))
        return cls(tokenizer, eod_token, [path, *configs], options.include_special_tokens)

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
        return cls(tokenizer, GPT2_EOD, [vocab, merges], options.include_special_tokens)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        encodings = self._encode(list(texts), add_special_tokens=self._special)
        return [encoding.ids for encoding in encodings]

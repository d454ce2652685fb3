"""The identity a Megatron tokenizer reports (``unique_identifiers``), computed from its flags.

GPTDataset writes ``config.tokenizer.unique_identifiers`` into the description its cache names
are hashed from, so a cache built offline is only found by the training job when the two
identities are equal byte for byte. Megatron's tokenizer wrapper (``MegatronTokenizerText``)
reports its class, the tokenizer path as given, then every keyword argument its
``build_tokenizer`` passed to the library, in that order, each as ``str(value)``; which
arguments are passed depends on the tokenizer type and on the release. This module writes the
same ordered dict from the same flags without loading the tokenizer (the ids, EOD and vocabulary
size come from the tokenizer plugin itself).

Two releases are known: Megatron-LM at the seed commit (the default) and megatron-core 0.16.1
(``TokenizerOptions.compat``).
"""

from __future__ import annotations

import json
from collections import OrderedDict
from typing import Any

from megafmt.errors import FormatError, PluginError
from megafmt.tokenizers.base import CORE_0_16, SEED, TokenizerOptions

#: Megatron's ``model_type`` (tokenizer metadata) -> the wrapper class it names
MODEL_CLASSES = {
    "default-text": "default_tokenizer.DefaultTokenizerText",
    "gpt": "gpt_tokenizer.GPTTokenizer",
    "mamba": "mamba_tokenizer.MambaTokenizer",
    "bert": "bert_tokenizer.BertTokenizer",
    "t5": "t5_tokenizer.T5Tokenizer",
}
MODELS_MODULE = "megatron.core.tokenizers.text.models"

#: Megatron's --tokenizer-type -> the tokenizer library its build_tokenizer loads
LIBRARIES = {
    "NullTokenizer": "null-text",
    "HuggingFaceTokenizer": "huggingface",
    "GPT2BPETokenizer": "megatron",
    "TikTokenizer": "tiktoken",
    "SentencePieceTokenizer": "sentencepiece",
    "GPTSentencePieceTokenizer": "sentencepiece",
    "Llama2Tokenizer": "sentencepiece",
    "SFTTokenizer": "sft",
}


def megatron_type(tokenizer_type: str, options: TokenizerOptions) -> str:
    """The Megatron ``--tokenizer-type`` a plugin name or Megatron name stands for."""
    if tokenizer_type in LIBRARIES:
        return tokenizer_type
    plugins = {
        "null": "NullTokenizer",
        "tiktoken": "TikTokenizer",
        "sentencepiece": "SentencePieceTokenizer",
        "huggingface": "GPT2BPETokenizer" if options.vocab_file else "HuggingFaceTokenizer",
    }
    if tokenizer_type not in plugins:
        raise PluginError(
            f"tokenizer {tokenizer_type!r} has no Megatron identity; one of "
            f"{', '.join([*LIBRARIES, *plugins])} has"
        )
    return plugins[tokenizer_type]


def _model_class(options: TokenizerOptions, library: str) -> str:
    """The wrapper class the tokenizer metadata (``--tokenizer-metadata``) names."""
    model_type = "default-text"
    if options.metadata_path is not None:
        try:
            with open(options.metadata_path, encoding="utf-8") as stream:
                metadata = json.load(stream)
        except OSError as error:
            raise FormatError(f"--tokenizer-metadata {options.metadata_path}: {error}") from None
        except ValueError as error:
            raise FormatError(f"{options.metadata_path}: not valid JSON ({error})") from None
        if not isinstance(metadata, dict):
            raise FormatError(f"{options.metadata_path}: expected a JSON object")
        if metadata.get("library", library) != library:
            raise FormatError(
                f"{options.metadata_path}: library {metadata['library']!r}, but the "
                f"tokenizer type loads {library!r}"
            )
        model_type = metadata.get("model_type") or model_type
    if model_type not in MODEL_CLASSES:
        raise FormatError(
            f"{options.metadata_path}: model_type must be one of {', '.join(MODEL_CLASSES)}, "
            f"found {model_type!r}"
        )
    return f"{MODELS_MODULE}.{MODEL_CLASSES[model_type]}"


def _listed(tokens: tuple[str, ...] | None) -> list[str] | None:
    return None if tokens is None else list(tokens)


def library_arguments(
    megatron_name: str, options: TokenizerOptions, sft_prompt_format: str | None = None
) -> tuple[str | None, dict[str, Any]]:
    """The path and the keyword arguments (in order) Megatron's ``build_tokenizer`` hands the
    tokenizer library for these flags, in the release ``options.compat`` names."""
    seed = options.compat == SEED
    special = _listed(options.special_tokens)
    arguments: dict[str, Any] = {}
    if megatron_name == "NullTokenizer":
        if options.vocab_size:
            arguments["vocab_size"] = options.vocab_size
        if seed and options.null_eod_id is not None:
            arguments["eod_id"] = options.null_eod_id
        if seed:
            arguments["pad_id"] = options.null_pad_id
        return None, arguments
    if megatron_name == "SFTTokenizer":
        return options.model, {"prompt_format": sft_prompt_format}
    if seed and megatron_name != "GPT2BPETokenizer":
        arguments["chat_template"] = options.chat_template
    if megatron_name in ("HuggingFaceTokenizer", "GPT2BPETokenizer"):
        additional = {"additional_special_tokens": special or []}
        files = {"vocab_file": options.vocab_file, "merges_file": options.merge_file}
        if megatron_name == "GPT2BPETokenizer":
            arguments.update(additional, **files)
        else:
            arguments.update(files, **additional)
        arguments["use_fast"] = options.uses_fast
        arguments["trust_remote_code"] = options.trust_remote_code
        arguments["include_special_tokens"] = options.adds_special_tokens
        path = megatron_name if megatron_name == "GPT2BPETokenizer" else options.model
        return path, arguments
    if megatron_name == "TikTokenizer":
        if options.tiktoken_pattern:
            arguments["pattern"] = options.tiktoken_pattern
        if options.vocab_size:
            arguments["vocab_size"] = options.vocab_size
        arguments["num_special_tokens"] = options.tiktoken_num_special_tokens
        arguments["special_tokens"] = special
        return options.model, arguments
    # the three sentencepiece types
    if seed:
        arguments["ignore_extra_whitespaces"] = options.sentencepiece_ignore_extra_whitespaces
    arguments["legacy"] = options.sentencepiece_legacy
    arguments["special_tokens"] = special
    return options.model, arguments


def megatron_identifiers(
    tokenizer_type: str, options: TokenizerOptions, sft_prompt_format: str | None = None
) -> OrderedDict:
    """The ``unique_identifiers`` of the tokenizer Megatron's ``build_tokenizer`` builds from
    these flags (``tokenizer_type``: a Megatron type or a plugin name)."""
    name = megatron_type(tokenizer_type, options)
    if name == "SFTTokenizer" and options.compat == CORE_0_16:
        raise PluginError("megatron-core 0.16.1's build_tokenizer has no SFTTokenizer")
    library = LIBRARIES[name]
    path, arguments = library_arguments(name, options, sft_prompt_format)
    if name == "NullTokenizer":
        cls = f"{MODELS_MODULE}.{MODEL_CLASSES['default-text']}"  # metadata is not read
    else:
        cls = _model_class(options, library)
    identifiers: OrderedDict = OrderedDict(**{"class": cls, "tokenizer_path": path})
    for key, value in arguments.items():
        identifiers[key] = str(value)
    return identifiers

"""Megatron's tokenizer flags (its ``_add_tokenizer_args`` at the seed commit, plus megatron-core
0.16.1's spellings), shared by every ``mega`` command that builds or names a tokenizer.

``mega preprocess`` builds the tokenizer from them; ``mega index build`` derives the identity a
training job's tokenizer reports from the same flags, so its cache is the job's.
"""

from __future__ import annotations

import argparse

from megafmt.tokenizers import MEGATRON_ALIASES, TOKENIZERS, TokenizerOptions
from megafmt.tokenizers.base import COMPATS, SEED
from megafmt.tokenizers.fast_backend import AUTO, BACKENDS


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, found {text!r}")
    return key, value


def _switch(
    group: argparse._ArgumentGroup, dest: str, off: tuple[str, str], on: tuple[str, str]
) -> None:
    """A setting the seed commit turns off with one flag and 0.16.1 turns on with another:
    ``dest`` is False, True, or None when neither is given (the release's default)."""
    pair = group.add_mutually_exclusive_group()
    for (flag, help_text), value in ((off, False), (on, True)):
        pair.add_argument(flag, dest=dest, action="store_const", const=value, help=help_text)


def add_tokenizer_arguments(
    parser: argparse.ArgumentParser, default_type: str | None, vocab_size_help: str
) -> argparse._ArgumentGroup:
    """Add the tokenizer flags to ``parser`` (as one group, returned)."""
    names = ", ".join([*TOKENIZERS.available(), *MEGATRON_ALIASES, "SFTTokenizer"])
    tok = parser.add_argument_group("tokenizer (Megatron's flags)")
    tok.add_argument("--tokenizer-type", default=default_type, help=f"one of: {names}")
    tok.add_argument("--tokenizer-model", help="tokenizer.json (or its folder), .model, vocab")
    tok.add_argument("--vocab-file", help="GPT-2 vocab.json")
    tok.add_argument("--merge-file", help="GPT-2 merges.txt")
    tok.add_argument("--vocab-size", type=int, help=vocab_size_help)
    tok.add_argument(
        "--tokenizer-metadata",
        help="Megatron's tokenizer_metadata.json (its model_type names the tokenizer class)",
    )
    tok.add_argument("--tokenizer-special-tokens", nargs="+", default=None)
    tok.add_argument("--tiktoken-pattern", choices=["v1", "v2"], help="default v2")
    tok.add_argument("--tiktoken-num-special-tokens", type=int, default=1000)
    tok.add_argument("--tokenizer-sentencepiece-legacy", action="store_true")
    tok.add_argument(
        "--no-tokenizer-sentencepiece-ignore-extra-whitespaces",
        "--disable-tokenizer-sentencepiece-ignore-extra-whitespaces",
        dest="tokenizer_sentencepiece_ignore_extra_whitespaces",
        action="store_false",
        help="keep runs of spaces a sentencepiece model would collapse",
    )
    _switch(
        tok,
        "tokenizer_hf_include_special_tokens",
        ("--tokenizer-hf-no-include-special-tokens", "do not let a tokenizer.json add its "
         "special tokens (the seed commit adds them)"),
        ("--tokenizer-hf-include-special-tokens", "megatron-core 0.16.1's flag: add them (its "
         "default is not to)"),
    )  # fmt: skip
    _switch(
        tok,
        "tokenizer_hf_use_fast",
        ("--tokenizer-hf-no-use-fast", "recorded only: the ids are the fast tokenizer's"),
        ("--tokenizer-hf-use-fast", "megatron-core 0.16.1's flag"),
    )
    tok.add_argument("--trust-remote-code", action="store_true")
    tok.add_argument("--null-tokenizer-eod-id", type=int, help="default: --vocab-size - 1")
    tok.add_argument("--null-tokenizer-pad-id", type=int, default=-1, help="default -1 (none)")
    tok.add_argument("--chat-template", help="a jinja chat template (recorded in the identity)")
    # accepted for Megatron's command lines; they change no token (padding sizes the model only)
    tok.add_argument("--padded-vocab-size", type=int, help=argparse.SUPPRESS)
    tok.add_argument(
        "--no-pad-vocab-size",
        "--disable-pad-vocab-size",
        dest="pad_vocab_size",
        action="store_false",
        help=argparse.SUPPRESS,
    )
    tok.add_argument("--vocab-extra-ids", type=int, default=0, help=argparse.SUPPRESS)
    tok.add_argument(
        "--tokenizer-compat",
        choices=COMPATS,
        default=SEED,
        help="whose tokenizer defaults and identities: Megatron-LM at the seed commit (default) "
        "or megatron-core 0.16.1 (NullTokenizer EOD = --vocab-size, no special tokens added)",
    )
    tok.add_argument(
        "--tokenizer-backend",
        choices=BACKENDS,
        default=AUTO,
        help="which library encodes a tokenizer.json: gigatoken where its check against the "
        "tokenizers library on this tokenizer passes, else tokenizers (auto, the default); "
        "gigatoken (fail where the check fails); reference (tokenizers). Same ids either way",
    )
    tok.add_argument(
        "--tokenizer-option",
        type=_key_value,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a setting for a third-party tokenizer plugin",
    )
    return tok


def tokenizer_options(args: argparse.Namespace) -> TokenizerOptions:
    """The :class:`TokenizerOptions` the flags of :func:`add_tokenizer_arguments` give."""
    special = args.tokenizer_special_tokens
    ignore_spaces = args.tokenizer_sentencepiece_ignore_extra_whitespaces
    return TokenizerOptions(
        model=args.tokenizer_model,
        vocab_file=args.vocab_file,
        merge_file=args.merge_file,
        vocab_size=args.vocab_size,
        special_tokens=None if special is None else tuple(special),
        tiktoken_pattern=args.tiktoken_pattern,
        tiktoken_num_special_tokens=args.tiktoken_num_special_tokens,
        include_special_tokens=args.tokenizer_hf_include_special_tokens,
        use_fast=args.tokenizer_hf_use_fast,
        trust_remote_code=args.trust_remote_code,
        chat_template=args.chat_template,
        metadata_path=args.tokenizer_metadata,
        sentencepiece_legacy=args.tokenizer_sentencepiece_legacy,
        sentencepiece_ignore_extra_whitespaces=ignore_spaces,
        null_eod_id=args.null_tokenizer_eod_id,
        null_pad_id=args.null_tokenizer_pad_id,
        compat=args.tokenizer_compat,
        extra=dict(args.tokenizer_option),
        backend=args.tokenizer_backend,
    )

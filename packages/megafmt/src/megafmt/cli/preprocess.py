"""``mega preprocess``: Megatron's tools/preprocess_data.py, with its flags, made fast.

Existing command lines work unchanged (``--tokenizer-type HuggingFaceTokenizer`` and the other
Megatron names are aliases of the tokenizer plugins). Megatron flags that cannot change the
output here are accepted and ignored: ``--tokenizer-hf-use-fast`` (the tokenizers package is
always the fast one) and ``--trust-remote-code`` (no code is fetched or run).
"""

from __future__ import annotations

import argparse
import os

from megafmt.cli.command import positive_int
from megafmt.cli.preprocess_ray import add_ray_arguments, ray_options
from megafmt.preprocess import PreprocessConfig, preprocess
from megafmt.preprocess.on_ray import preprocess_on_ray
from megafmt.sft import DEFAULT_PROMPT_FORMAT, PROMPT_FORMATS, preprocess_sft
from megafmt.tokenizers import MEGATRON_ALIASES, TOKENIZERS, TokenizerOptions


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, found {text!r}")
    return key, value


class PreprocessCommand:
    help = "tokenize jsonl corpora into .bin/.idx pairs (Megatron's preprocess_data.py flags)"

    def configure(self, parser: argparse.ArgumentParser) -> None:
        data = parser.add_argument_group("input and output")
        data.add_argument(
            "--input",
            required=True,
            help="jsonl file (.gz, .zst too), a glob, a directory, or an fsspec URL; parquet "
            "when pyarrow is installed. A file or directory of exactly that name wins over "
            "reading the name as a glob pattern",
        )
        data.add_argument("--output-prefix", required=True, help="<prefix>_<key>_document.bin/idx")
        data.add_argument("--json-keys", nargs="+", default=["text"], help="keys to tokenize")
        data.add_argument("--split-sentences", action="store_true", help="split with NLTK punkt")
        data.add_argument("--keep-newlines", action="store_true", help="keep newlines")
        data.add_argument("--lang", default="english", help="punkt language")
        data.add_argument("--append-eod", action="store_true", help="end each document with EOD")
        data.add_argument(
            "--skip-bad-lines",
            action="store_true",
            help="count and skip lines that cannot be read instead of stopping at the first",
        )
        names = ", ".join([*TOKENIZERS.available(), *MEGATRON_ALIASES])
        tok = parser.add_argument_group("tokenizer")
        tok.add_argument("--tokenizer-type", default="bytes", help=f"one of: {names}")
        tok.add_argument("--tokenizer-model", help="tokenizer.json (or its folder), .model, vocab")
        tok.add_argument("--vocab-file", help="GPT-2 vocab.json")
        tok.add_argument("--merge-file", help="GPT-2 merges.txt")
        tok.add_argument(
            "--vocab-size", type=positive_int, help="null tokenizer vocabulary; tiktoken size"
        )
        tok.add_argument("--tokenizer-special-tokens", nargs="+", default=[])
        tok.add_argument("--tiktoken-pattern", default="v2", choices=["v1", "v2"])
        tok.add_argument("--tiktoken-num-special-tokens", type=int, default=1000)
        tok.add_argument("--tokenizer-hf-include-special-tokens", action="store_true")
        tok.add_argument("--tokenizer-hf-use-fast", action="store_true", help=argparse.SUPPRESS)
        tok.add_argument("--trust-remote-code", action="store_true", help=argparse.SUPPRESS)
        tok.add_argument(
            "--tokenizer-option",
            type=_key_value,
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="a setting for a third-party tokenizer plugin",
        )
        sft = parser.add_argument_group("supervised fine-tuning")
        sft.add_argument(
            "--sft",
            action="store_true",
            help="tokenize an SFT jsonl ('messages' per line) with the SFT tokenizer at "
            "--tokenizer-model into <prefix>_messages_document.bin/.idx/.lossmask",
        )
        sft.add_argument(
            "--sft-tokenizer-prompt-format",
            default=DEFAULT_PROMPT_FORMAT,
            choices=sorted(PROMPT_FORMATS),
            help="Megatron-LM's SFT prompt format",
        )
        run = parser.add_argument_group("runtime")
        run.add_argument(
            "--workers", type=positive_int, default=os.cpu_count() or 1, help="processes"
        )
        run.add_argument(
            "--partitions", type=positive_int, default=1, help="Megatron's input partitions"
        )
        run.add_argument("--keep-sequential-samples", action="store_true")
        run.add_argument(
            "--log-interval", type=positive_int, default=1000, help="documents per line"
        )
        run.add_argument("--chunk-mb", type=float, default=1.0, help="input per worker call")
        add_ray_arguments(parser)

    def run(self, args: argparse.Namespace) -> int:
        if args.sft:
            if not args.tokenizer_model:
                raise SystemExit("mega preprocess --sft needs --tokenizer-model (a folder)")
            preprocess_sft(
                args.input,
                args.output_prefix,
                args.tokenizer_model,
                args.sft_tokenizer_prompt_format,
                args.skip_bad_lines,
            )
            return 0
        options = TokenizerOptions(
            model=args.tokenizer_model,
            vocab_file=args.vocab_file,
            merge_file=args.merge_file,
            vocab_size=args.vocab_size,
            special_tokens=tuple(args.tokenizer_special_tokens),
            tiktoken_pattern=args.tiktoken_pattern,
            tiktoken_num_special_tokens=args.tiktoken_num_special_tokens,
            include_special_tokens=args.tokenizer_hf_include_special_tokens,
            extra=dict(args.tokenizer_option),
        )
        config = PreprocessConfig(
            input=args.input,
            output_prefix=args.output_prefix,
            tokenizer_type=args.tokenizer_type,
            tokenizer_options=options,
            json_keys=tuple(args.json_keys),
            append_eod=args.append_eod,
            workers=args.workers,
            partitions=args.partitions,
            keep_sequential_samples=args.keep_sequential_samples,
            split_sentences=args.split_sentences,
            keep_newlines=args.keep_newlines,
            lang=args.lang,
            skip_bad_lines=args.skip_bad_lines,
            log_interval=args.log_interval,
            chunk_bytes=max(1, int(args.chunk_mb * (1 << 20))),
        )
        on_ray = ray_options(args)
        if on_ray is not None:
            preprocess_on_ray(config, on_ray)
        else:
            preprocess(config)
        return 0

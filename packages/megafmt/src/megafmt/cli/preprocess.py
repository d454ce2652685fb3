"""``mega preprocess``: Megatron's tools/preprocess_data.py, with its flags, made fast.

Every flag of the tool at the seed commit is taken with its meaning (the tokenizer flags are
shared with ``mega index build``: megafmt.cli.tokenizer_flags), and megatron-core 0.16.1's
spellings too; ``--tokenizer-type HuggingFaceTokenizer`` and the other Megatron names are aliases
of the tokenizer plugins. Flags that cannot change a token here are accepted and enter the
tokenizer's identity, as at the seed commit: ``--tokenizer-hf-no-use-fast`` (the tokenizers
package is the fast implementation), ``--trust-remote-code`` (no code is fetched or run) and
``--chat-template``; ``--padded-vocab-size``, ``--no-pad-vocab-size`` and ``--vocab-extra-ids``
are accepted and ignored, as the tool ignores them (they size the model, not the data).
"""

from __future__ import annotations

import argparse
import os
import sys

from megafmt.cli.command import positive_float, positive_int
from megafmt.cli.preprocess_ray import add_ray_arguments, ray_options
from megafmt.cli.tokenizer_flags import add_tokenizer_arguments, tokenizer_options
from megafmt.preprocess import PreprocessConfig, preprocess
from megafmt.preprocess.blocks import block_path_note
from megafmt.preprocess.on_ray import preprocess_on_ray
from megafmt.preprocess.pool import worker_context
from megafmt.preprocess.tuning import preprocess_with_best_workers
from megafmt.sft import DEFAULT_PROMPT_FORMAT, PROMPT_FORMATS, preprocess_sft
from megafmt.tokenizers import with_checked_backend

#: the tokenizer of a run that names no tokenizer type and no tokenizer file
DEFAULT_TOKENIZER = "bytes"
#: flags that name a tokenizer's files: given without --tokenizer-type, the type is asked for
_TOKENIZER_FILE_FLAGS = ("tokenizer_model", "vocab_file", "merge_file", "tokenizer_metadata")


def tokenizer_type(args: argparse.Namespace) -> str:
    """``--tokenizer-type``, or the built-in bytes tokenizer when no tokenizer file is given
    either; a tokenizer file without a type is refused (it would be ignored: the bytes
    tokenizer reads no file), naming the file and the types to choose from."""
    if args.tokenizer_type is not None:
        return args.tokenizer_type
    given = [
        f"--{name.replace('_', '-')} {vars(args)[name]}"
        for name in _TOKENIZER_FILE_FLAGS
        if vars(args)[name] is not None
    ]
    if given:
        raise SystemExit(
            f"mega preprocess: {', '.join(given)} given without --tokenizer-type; name the "
            "tokenizer's type (HuggingFaceTokenizer for a tokenizer.json, "
            "SentencePieceTokenizer for a .model, TikTokenizer for a .tiktoken, GPT2BPETokenizer "
            "for vocab.json + merges.txt); without a tokenizer file the built-in bytes "
            "tokenizer is used"
        )
    return DEFAULT_TOKENIZER


class PreprocessCommand:
    help = "tokenize jsonl corpora into .bin/.idx pairs (Megatron's preprocess_data.py flags)"

    def configure(self, parser: argparse.ArgumentParser) -> None:
        data = parser.add_argument_group("input and output")
        data.add_argument(
            "--input",
            required=True,
            help="jsonl file (.gz, .zst, .bz2, .xz too), a glob, a directory (its hidden files "
            "and folders aside), or an fsspec URL; parquet when pyarrow is installed. A file or "
            "directory of exactly that name wins over reading the name as a glob pattern",
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
        add_tokenizer_arguments(
            parser,
            None,
            "the null tokenizer's vocabulary; tiktoken's total size (default type: "
            f"{DEFAULT_TOKENIZER}, when no tokenizer file is given)",
        )
        sft = parser.add_argument_group("supervised fine-tuning")
        sft.add_argument(
            "--sft",
            action="store_true",
            help="tokenize an SFT jsonl ('messages' per line) with the SFT tokenizer at "
            "--tokenizer-model into <prefix>_messages_document.bin/.idx/.lossmask (also "
            "--tokenizer-type SFTTokenizer)",
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
        run.add_argument(
            "--chunk-mb", type=positive_float, default=1.0, help="input per worker call"
        )
        run.add_argument(
            "--find-optimal-num-workers",
            action="store_true",
            help="time a trial run per --workers-to-check count, report them, then preprocess "
            "everything with the fastest",
        )
        run.add_argument(
            "--workers-to-check", type=int, nargs="+", default=[16, 32, 64], metavar="N"
        )
        run.add_argument(
            "--max-documents",
            type=positive_int,
            default=100_000,
            help="documents per --find-optimal-num-workers trial",
        )
        add_ray_arguments(parser)

    def run(self, args: argparse.Namespace) -> int:
        on_ray = ray_options(args)
        if args.sft or args.tokenizer_type == "SFTTokenizer":
            if on_ray is not None or args.find_optimal_num_workers:
                raise SystemExit(
                    "mega preprocess --sft: --ray and --find-optimal-num-workers preprocess "
                    "plain text only"
                )
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
        if args.find_optimal_num_workers and on_ray is not None:
            raise SystemExit(
                "mega preprocess: --find-optimal-num-workers times local workers; "
                "it does not combine with --ray"
            )
        # the backend's self-check runs once here, said in one line; the workers (and Ray's
        # shards) get the library it chose
        kind = tokenizer_type(args)
        # the workers' start, chosen before the self-check's library starts its threads (a Ray
        # task chooses in its own process, which holds Ray's threads)
        start_method = worker_context().get_start_method() if on_ray is None else None
        config = PreprocessConfig(
            input=args.input,
            output_prefix=args.output_prefix,
            tokenizer_type=kind,
            tokenizer_options=with_checked_backend(kind, tokenizer_options(args)),
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
            start_method=start_method,
        )
        if args.find_optimal_num_workers:
            preprocess_with_best_workers(config, args.workers_to_check, args.max_documents)
        elif on_ray is not None:
            preprocess_on_ray(config, on_ray)
        else:
            note = block_path_note(config.tokenizer_options.backend, config.split_sentences)
            print(f"input: {note}", file=sys.stderr)
            preprocess(config)
        return 0

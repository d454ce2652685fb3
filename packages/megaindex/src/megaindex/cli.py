"""``mega index``: build a GPTDataset index cache offline, inspect a cache, explain a sample.

``mega index build`` takes the arguments a Megatron job gives its dataset (data path, split,
sequence length, seed, sample counts, tokenizer identity) and builds the cache before the job
starts, reporting each phase; the job then finds every table cached.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from megaindex.builder import BlendedMegatronDatasetBuilder
from megaindex.cache_report import inspect_cache
from megaindex.config import GPTDatasetConfig
from megaindex.gpt_dataset import GPTDataset
from megaindex.tokenizer import IdentifiedTokenizer
from megaindex.utils import Split


def _dataset_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data-path", required=True, metavar="PREFIX", help="corpus prefix")
    parser.add_argument(
        "--split",
        default="969,30,1",
        help="train,valid,test weights (default: Megatron's legacy 969,30,1)",
    )
    parser.add_argument("--seq-length", type=int, required=True, help="tokens per sample")
    parser.add_argument("--seed", type=int, default=1234, help="random seed (Megatron: 1234)")
    samples = parser.add_mutually_exclusive_group(required=True)
    samples.add_argument(
        "--samples",
        metavar="TRAIN[,VALID[,TEST]]",
        help="samples per split; an empty or omitted count builds one epoch",
    )
    samples.add_argument(
        "--train-iters",
        type=int,
        help="training iterations (with "
        "--global-batch-size: train samples = iterations x batch size)",
    )
    parser.add_argument("--global-batch-size", type=int, help="samples per iteration")
    parser.add_argument("--cache-dir", help="path_to_cache (default: <prefix>/cache/...)")
    tokenizer = parser.add_mutually_exclusive_group(required=True)
    tokenizer.add_argument(
        "--null-tokenizer",
        type=int,
        metavar="VOCAB",
        help="megatron-core's NullTokenizer(VOCAB): EOD = VOCAB",
    )
    tokenizer.add_argument(
        "--tokenizer-identifiers",
        metavar="JSON",
        help="the unique_identifiers of the job's tokenizer (with --eod and --vocab-size)",
    )
    parser.add_argument("--eod", type=int, help="end-of-document id (with --tokenizer-identifiers)")
    parser.add_argument(
        "--vocab-size", type=int, help="vocabulary size (with --tokenizer-identifiers)"
    )
    parser.add_argument(
        "--no-extra-token", action="store_true", help="add_extra_token_to_sequence=False"
    )
    parser.add_argument(
        "--keep-last-partial-validation",
        action="store_true",
        help="drop_last_partial_validation_sequence=False",
    )


def _sizes(args: argparse.Namespace) -> list[int | None]:
    if args.train_iters is not None:
        if args.global_batch_size is None:
            raise ValueError("--train-iters needs --global-batch-size")
        return [args.train_iters * args.global_batch_size, None, None]
    counts: list[int | None] = [int(c) if c.strip() else None for c in args.samples.split(",")]
    if len(counts) > len(Split):
        raise ValueError(f"--samples takes at most 3 counts, got {args.samples!r}")
    return counts + [None] * (len(Split) - len(counts))


def _tokenizer(args: argparse.Namespace) -> IdentifiedTokenizer:
    if args.null_tokenizer is not None:
        return IdentifiedTokenizer.null(args.null_tokenizer)
    if args.eod is None:
        raise ValueError("--tokenizer-identifiers needs --eod")
    return IdentifiedTokenizer(args.eod, args.vocab_size, json.loads(args.tokenizer_identifiers))


def build_datasets(args: argparse.Namespace, sizes: list[int | None] | None = None) -> list[Any]:
    """The datasets ``args`` describe, built (or loaded from the cache)."""
    config = GPTDatasetConfig(
        random_seed=args.seed,
        sequence_length=args.seq_length,
        blend=([args.data_path], None),
        split=args.split,
        path_to_cache=args.cache_dir,
        tokenizer=_tokenizer(args),
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
        add_extra_token_to_sequence=not args.no_extra_token,
        drop_last_partial_validation_sequence=not args.keep_last_partial_validation,
    )
    return BlendedMegatronDatasetBuilder(
        GPTDataset, sizes or _sizes(args), lambda: True, config
    ).build()


def _report_built(split: Split, dataset: GPTDataset) -> str:
    source = dataset.index_source
    key = source.cache_entry.base if source.cache_entry else "(not cached)"
    line = f"{split.name:<5} {len(dataset):>12,} samples  {source.kind:<6}  {key}"
    if source.seconds:
        phases = ", ".join(f"{name} {seconds:.2f} s" for name, seconds in source.seconds.items())
        line += f"\n      {phases}"
    if dataset.epoch_plan is not None:
        plan = dataset.epoch_plan
        line += (
            f"\n      {plan.num_epochs} epoch(s) of {plan.tokens_per_epoch:,} tokens, "
            f"separate final epoch: {'yes' if plan.separate_final_epoch else 'no'}"
        )
    return line


class IndexCommand:
    help = "build, inspect and explain GPTDataset index caches"

    def configure(self, parser: argparse.ArgumentParser) -> None:
        commands = parser.add_subparsers(dest="index_command", metavar="SUBCOMMAND", required=True)
        build = commands.add_parser("build", help="build the index cache before a job starts")
        _dataset_arguments(build)
        inspect = commands.add_parser("inspect", help="what a cache directory holds")
        inspect.add_argument("cache_dir", metavar="CACHE_DIR")
        inspect.add_argument("--json", action="store_true", help="print JSON")
        explain = commands.add_parser("explain", help="which documents a sample is cut from")
        _dataset_arguments(explain)
        explain.add_argument("--sample", type=int, required=True, help="sample number")
        explain.add_argument(
            "--split-name",
            choices=[s.name for s in Split],
            default="train",
            help="the split the sample belongs to",
        )
        explain.add_argument("--tokens", action="store_true", help="print the token ids too")

    def run(self, args: argparse.Namespace) -> int:
        return {"build": self._build, "inspect": self._inspect, "explain": self._explain}[
            args.index_command
        ](args)

    def _build(self, args: argparse.Namespace) -> int:
        start = time.perf_counter()
        datasets = build_datasets(args)
        for split, dataset in zip(Split, datasets, strict=True):
            if dataset is not None:
                print(_report_built(split, dataset))
        print(f"done in {time.perf_counter() - start:.2f} s")
        return 0

    def _inspect(self, args: argparse.Namespace) -> int:
        reports = inspect_cache(args.cache_dir)
        if args.json:
            print(
                json.dumps(
                    [vars(r) | {"bytes_on_disk": r.bytes_on_disk} for r in reports], indent=2
                )
            )
            return 0
        if not reports:
            print(f"{args.cache_dir}: no cached datasets")
        for report in reports:
            described = report.description
            print(f"{report.base}")
            print(
                f"  {described.get('class')} {described.get('index_split')} of "
                f"{described.get('dataset_path')}: seq {described.get('sequence_length')}, "
                f"seed {described.get('random_seed')}, split {described.get('split')}"
            )
            samples = report.samples
            print(f"  samples: {samples:,}" if samples is not None else "  samples: unknown")
            if report.plan:
                print(
                    f"  epochs: {report.plan['num_epochs']}, separate final epoch: "
                    f"{'yes' if report.plan['separate_final_epoch'] else 'no'}"
                )
            else:
                print("  epochs: not recorded (built by megatron-core)")
            for table, info in report.tables.items():
                shape = info.get("shape", info.get("error"))
                print(
                    f"  {table:<15} {info.get('dtype', '?'):<7} {shape!s:<16} "
                    f"{info['bytes']:>14,} bytes"
                )
            print(f"  total {report.bytes_on_disk:,} bytes")
        return 0

    def _explain(self, args: argparse.Namespace) -> int:
        split = Split[args.split_name]
        dataset = build_datasets(args)[split.value]
        if dataset is None:
            raise ValueError(f"the {split.name} split is empty with --split {args.split}")
        if not 0 <= args.sample < len(dataset):
            raise IndexError(
                f"sample {args.sample} out of range: the {split.name} split has {len(dataset)}"
            )
        row = int(dataset.shuffle_index[args.sample])
        (begin, begin_offset), (end, end_offset) = dataset.sample_index[row : row + 2].tolist()
        extra = int(dataset.config.add_extra_token_to_sequence)
        print(
            f"{split.name} sample {args.sample} is row {row} of the sample index: from "
            f"document_index[{begin}] offset {begin_offset} to document_index[{end}] offset "
            f"{end_offset} (+{extra} extra token)"
        )
        text, documents = dataset._query_document_sample_shuffle_indices(args.sample)
        for position, document in zip(range(begin, end + 1), documents.tolist(), strict=True):
            length = int(dataset.dataset.sequence_lengths[document])
            first = begin_offset if position == begin else 0
            last = end_offset + extra if position == end else length
            print(f"  document {document:>10}  tokens [{first}, {last}) of {length}")
        if args.tokens:
            print(" ".join(map(str, text.tolist())))
        return 0

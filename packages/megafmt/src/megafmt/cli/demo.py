"""``mega demo``: the whole pipeline on real English text that ships with Python, offline, or on
the user's own corpora: tokenizer, preprocess and verify, a blended GPTDataset split three ways,
loaders on two data-parallel ranks stopped and resumed, get_batch on TP=2 x CP=2 gloo ranks, one
sample decoded, and a summary with a plot.

Each package contributes its stages; with only megafmt installed the tour covers the format
(and says what to install for the rest).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from megafmt.blend_list import parse_blend_list
from megafmt.cli.command import non_negative_int, positive_int
from megafmt.cli.tokenizer_flags import add_tokenizer_arguments, tokenizer_options
from megafmt.demo.report import plot, render, summary
from megafmt.demo.run import DemoCorpus, DemoRun, DemoSettings
from megafmt.demo.tour import missing_stages, run_tour

#: the two sizes of the default tour (CI runs the small one)
SIZES = {
    "small": {"docstrings": 1500, "vocab": 2000, "seq_length": 64, "steps": 12, "samples": 400},
    "full": {"docstrings": 20000, "vocab": 8000, "seq_length": 256, "steps": 60, "samples": 4000},
}


def corpora_from_data_path(items: list[str]) -> list[DemoCorpus]:
    """Megatron's ``--data-path``: prefixes, or pairs of weight and prefix."""
    prefixes, weights = parse_blend_list(items, "--data-path")
    names = unique_names([Path(prefix).name for prefix in prefixes])
    return [
        DemoCorpus(name, prefix, None if weights is None else weights[index])
        for index, (name, prefix) in enumerate(zip(names, prefixes, strict=True))
    ]


def corpora_from_inputs(paths: list[str]) -> list[DemoCorpus]:
    """jsonl files to preprocess, blended in equal parts."""
    names = unique_names([Path(path).stem for path in paths])
    return [
        DemoCorpus(name, "", 1.0, source=Path(path))
        for name, path in zip(names, paths, strict=True)
    ]


def unique_names(names: list[str]) -> list[str]:
    """``names``, a repeated one numbered from its second occurrence (``a``, ``a-2``)."""
    seen: dict[str, int] = {}
    unique = []
    for name in names:
        seen[name] = seen.get(name, 0) + 1
        unique.append(name if seen[name] == 1 else f"{name}-{seen[name]}")
    return unique


class DemoCommand:
    help = (
        "tour the pipeline on text that ships with Python (or your corpora): preprocess, "
        "blend, load with resume, get_batch on gloo ranks, decode, summary and plot"
    )

    def configure(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--size", choices=sorted(SIZES), default="full")
        parser.add_argument("--output", default="mega-demo", help="folder for everything made")
        parser.add_argument("--summary", help="also write the summary as JSON to this file")
        given = parser.add_mutually_exclusive_group()
        given.add_argument(
            "--data-path",
            nargs="+",
            help="your preprocessed corpora, as Megatron takes them: [WEIGHT] PREFIX ...",
        )
        given.add_argument("--input", nargs="+", help="your jsonl files, preprocessed first")
        parser.add_argument("--split", default="90,8,2")
        parser.add_argument("--seq-length", type=positive_int)
        parser.add_argument("--micro-batch-size", type=positive_int, default=4)
        parser.add_argument("--steps", type=positive_int, help="micro-batches per rank")
        parser.add_argument("--train-samples", type=positive_int)
        parser.add_argument("--seed", type=int, default=1234)
        parser.add_argument("--num-workers", type=non_negative_int, default=2)
        add_tokenizer_arguments(
            parser, None, "NullTokenizer: ids below it (default: a trained BPE of the tour's size)"
        )

    def run(self, args: argparse.Namespace) -> int:
        size = SIZES[args.size]
        folder = Path(args.output).resolve()
        folder.mkdir(parents=True, exist_ok=True)
        micro_batch_size, steps = args.micro_batch_size, args.steps or size["steps"]
        # as Megatron sizes the training split from its iterations: at least what is read
        samples = max(
            args.train_samples or size["samples"],
            steps * micro_batch_size * DemoSettings.data_parallel_size,
        )
        settings = DemoSettings(
            folder=folder,
            seq_length=args.seq_length or size["seq_length"],
            micro_batch_size=micro_batch_size,
            steps=steps,
            samples=(samples, max(1, samples // 10), max(1, samples // 20)),
            split=args.split,
            seed=args.seed,
            num_workers=args.num_workers,
            docstrings=size["docstrings"],
            vocab_size=args.vocab_size or size["vocab"],
        )
        run = DemoRun(settings)
        if args.tokenizer_type is not None:
            run.tokenizer_type = args.tokenizer_type
            run.tokenizer_options = tokenizer_options(args)
        if args.data_path:
            if run.tokenizer_type is None:
                raise ValueError(
                    "--data-path: give the tokenizer the corpora were made with "
                    "(--tokenizer-type and its files): the tour needs its end-of-document id"
                )
            run.corpora = corpora_from_data_path(args.data_path)
        elif args.input:
            run.corpora = corpora_from_inputs(args.input)
        run_tour(run)
        png = folder / "demo.png"
        report = summary(run, png if plot(png, run) else None)
        print("\n== summary")
        print(render(report))
        for line in missing_stages():
            print(f"  not installed: the {line}")
        if args.summary:
            Path(args.summary).write_text(json.dumps(report, indent=2))
        failed = [name for name, passed in report["checks"].items() if not passed]
        if failed:
            print(f"mega demo: checks failed: {', '.join(failed)}", file=sys.stderr)
            return 1
        return 0

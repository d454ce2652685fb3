"""Tokenizing side by side: every way to turn a jsonl corpus into ids, on the same input, in one
run (issue 28's table).

    .venv/bin/python tools/bench/bench_tokenize.py [--size-mb 4] [--rounds 3]
        [--corpora prose code multilingual synthetic] [--workers 1 2] [--rows FILE]

Each corpus (bench_preprocess.py's prose, code and synthetic, and ``multilingual``: paragraphs
of CJK, Cyrillic, Arabic, Devanagari and emoji pseudo-words) gets a byte-level BPE tokenizer
trained on it. For each worker count the contenders are:

- ``seed tool``: the seed commit's tools/preprocess_data.py, in a seed worker process (left out,
  with a line saying so, where the seed's source is absent);
- ``megatron-core``: megatron-core 0.16.1's tool steps (tools/compat/megatron_preprocess.py);
- ``tokenizers``: the library alone, ``encode_batch_fast`` of the texts already in memory, on
  its own thread pool whatever the worker count (setting ``TOKENIZERS_PARALLELISM`` here would
  keep it on in the reference's forked workers, which then wait forever on a pool that the
  fork did not copy);
- ``gigatoken bulk``: gigatoken's own ``encode_files`` of the jsonl (one thread for 1 worker,
  its pool for more): the floor to approach;
- ``mega preprocess``: with ``--tokenizer-backend auto`` (gigatoken after its self-check) and
  ``reference`` (the tokenizers library whole-text).

MB/s is the jsonl's size over the wall time, tokens/s the output's tokens over it; the median of
``--rounds`` alternating rounds is reported. The outputs of mega preprocess and of the seed tool
(else megatron-core's) are compared byte for byte. Files go to ``build/bench/tokenize``.
"""

from __future__ import annotations

import contextlib
import filecmp
import json
import shutil
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import benchreport
import numpy

REFERENCE = benchreport.enter_reference(("megatron-core",))
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "testing"))

import bench_preprocess  # noqa: E402  (its corpora and tokenizer training)
from seedref import SeedProcess, seed_unavailable  # noqa: E402

from megafmt import IndexedDataset  # noqa: E402
from megafmt.preprocess import PreprocessConfig, preprocess  # noqa: E402
from megafmt.tokenizers import TokenizerOptions  # noqa: E402

#: letters of each script the multilingual corpus draws its pseudo-words from
SCRIPTS = {
    "cjk": [chr(c) for c in range(0x4E00, 0x4E00 + 3000)],
    "cyrillic": [chr(c) for c in range(0x0430, 0x0450)],
    "arabic": [chr(c) for c in range(0x0621, 0x064B)],
    "devanagari": [chr(c) for c in range(0x0915, 0x0939)]
    + ["\u093e", "\u093f", "\u0947", "\u094d"],
    "emoji": [chr(c) for c in range(0x1F600, 0x1F650)],
}


def multilingual_documents(seed: int = 0) -> Iterator[str]:
    """Paragraphs of Zipf-distributed pseudo-words, each in one script (CJK without spaces)."""
    rng = numpy.random.default_rng(seed)
    vocabularies = {
        name: ["".join(rng.choice(letters, rng.integers(1, 4 if name == "cjk" else 9)))
               for _ in range(5000)]
        for name, letters in SCRIPTS.items()
    }  # fmt: skip
    while True:
        paragraphs = []
        for _ in range(rng.integers(2, 8)):
            name = rng.choice(list(SCRIPTS))
            words = vocabularies[name]
            ids = numpy.minimum(rng.zipf(1.3, rng.integers(20, 300)), len(words)) - 1
            joiner = "" if name == "cjk" else " "
            paragraphs.append(joiner.join(words[i] for i in ids))
        yield "\n\n".join(paragraphs)


bench_preprocess.CORPORA["multilingual"] = multilingual_documents


def timed(run: Callable[[], object]) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def contenders(work: Path, source: Path, workers: int, seed: SeedProcess | None) -> dict:
    """Each contender's run for ``workers``, and where it writes its output (None: none)."""
    options = TokenizerOptions(model=str(work))
    texts = [json.loads(line)["text"] for line in source.open(encoding="utf-8")]
    import gigatoken
    import tokenizers

    library = tokenizers.Tokenizer.from_file(str(work / "tokenizer.json"))
    fast = gigatoken.Tokenizer.from_json((work / "tokenizer.json").read_text())

    def library_alone() -> None:
        library.encode_batch_fast(texts, add_special_tokens=False)

    def gigatoken_bulk() -> None:
        fast.encode_files(gigatoken.JsonlFileSource([str(source)]), parallel=workers > 1)

    def ours(backend: str) -> Callable[[], object]:
        config = PreprocessConfig(
            input=str(source),
            output_prefix=str(work / f"ours-{backend}" / "out"),
            tokenizer_type="HuggingFaceTokenizer",
            tokenizer_options=TokenizerOptions(model=str(work), backend=backend),
            append_eod=True,
            workers=workers,
            log_interval=10**9,
        )
        return lambda: preprocess(config)

    flags = ["--input", str(source), "--tokenizer-type", "HuggingFaceTokenizer",
             "--tokenizer-model", str(work), "--workers", str(workers), "--append-eod",
             "--log-interval", str(10**9)]  # fmt: skip
    runs = {}
    if seed is not None:
        prefix = work / "seed" / "out"
        runs["seed tool"] = (
            lambda: seed.call(
                "seed_tokenizers:preprocess_data", [*flags, "--output-prefix", str(prefix)]
            ),
            f"{prefix}_text_document",
        )
    run_core = bench_preprocess.reference_tool(
        "HuggingFaceTokenizer", options, source, work / "core" / "out", workers
    )
    runs["megatron-core 0.16.1"] = (run_core, f"{work}/core/out_text_document")
    runs["tokenizers alone"] = (library_alone, None)
    runs["gigatoken bulk"] = (gigatoken_bulk, None)
    runs["mega preprocess (reference)"] = (ours("reference"), None)
    runs["mega preprocess"] = (ours("auto"), f"{work}/ours-auto/out_text_document")
    return runs


def bench_corpus(corpus: str, args, report: benchreport.Report, seed) -> list[str]:
    """The table rows of one corpus."""
    work = ROOT / "build" / "bench" / "tokenize"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    source = work / "input.jsonl"
    lines = bench_preprocess.make_input(source, args.size_mb, corpus)
    bench_preprocess.train_tokenizer(work, source, args.vocab_size)
    megabytes = source.stat().st_size / 1e6
    conditions = f"{corpus}, {lines:,} documents, {megabytes:.3g} MB, vocab {args.vocab_size}"
    report.heading(f"tokenize: {conditions}")
    rows = []
    for workers in args.workers:
        runs = contenders(work, source, workers, seed)
        seconds: dict[str, list[float]] = {name: [] for name in runs}
        same = True  # in every round
        for _ in range(args.rounds):
            for folder in ("seed", "core", "ours-auto", "ours-reference"):
                shutil.rmtree(work / folder, ignore_errors=True)
                (work / folder).mkdir()
            for name, (run, _) in runs.items():
                seconds[name].append(timed(run))
            outputs = {name: out for name, (_, out) in runs.items() if out}
            ours_out = outputs.pop("mega preprocess")
            theirs = outputs.get("seed tool", outputs["megatron-core 0.16.1"])
            same &= all(
                filecmp.cmp(ours_out + x, theirs + x, shallow=False) for x in (".bin", ".idx")
            )
        tokens = int(IndexedDataset(ours_out).sequence_lengths.sum())
        median = {name: statistics.median(times) for name, times in seconds.items()}
        for name, time_taken in median.items():
            rows.append(
                f"| {corpus} | {workers} | {name} | {megabytes / time_taken:.2f} | "
                f"{tokens / time_taken / 1e6:.2f} | {time_taken / median['mega preprocess']:.2f}x |"
            )
            print(rows[-1], flush=True)
        for name, reference in (("megatron-core 0.16.1", "megatron-core"), ("seed tool", "seed")):
            if name in median:
                benchreport.Report("tokenize", reference, args.rows).compare(
                    f"tokenize {corpus}, {workers} workers",
                    ours=megabytes / median["mega preprocess"],
                    theirs=megabytes / median[name],
                    unit="MB/s",
                    higher_is_better=True,
                    conditions=conditions,
                )
        report.note(
            f"{tokens:,} tokens; mega preprocess and "
            f"{'the seed tool' if seed else 'megatron-core'} byte-identical: "
            f"{'yes' if same else 'NO'}; mega preprocess's time / gigatoken bulk's: "
            f"{median['mega preprocess'] / median['gigatoken bulk']:.2f}x"
        )
    shutil.rmtree(work, ignore_errors=True)
    return rows


def main() -> None:
    parser = benchreport.parser(__doc__)
    parser.add_argument("--size-mb", type=float, default=4)
    parser.add_argument("--vocab-size", type=int, default=8192)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument(
        "--corpora",
        nargs="+",
        choices=sorted(bench_preprocess.CORPORA),
        default=["prose", "code", "multilingual", "synthetic"],
    )
    args = parser.parse_args()
    report = benchreport.Report("tokenize", REFERENCE, args.rows)
    rows = ["| corpus | workers | contender | MB/s | M tokens/s | its time / mega preprocess's |",
            "|---|---|---|---|---|---|"]  # fmt: skip
    absent = seed_unavailable()
    if absent:
        print(f"the seed tool is left out: {absent}", flush=True)
    seedside = ROOT / "tests" / "compat" / "seedside"
    with SeedProcess(paths=[seedside]) if not absent else contextlib.nullcontext() as seed:
        for corpus in args.corpora:
            rows += bench_corpus(corpus, args, report, seed)
    print("\n".join(rows))


if __name__ == "__main__":
    main()

"""Tokenizing side by side: every way to turn a jsonl corpus into ids, on the same input, in one
run (issue 28's table).

    .venv/bin/python tools/bench/bench_tokenize.py [--size-mb 20] [--prefix-mb 2] [--rounds 3]
        [--corpora prose code multilingual synthetic] [--workers 1 2] [--ray] [--rows FILE]

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
  its pool for more) in this process, its tokenizer loaded once and reused in every round (its
  pretoken cache warm from the second): the floor to approach;
- ``gigatoken bulk (fresh process)``: the same call in a fresh process each round, timed as a
  mega preprocess run is (imports aside, the tokenizer's load included, the cache cold);
- ``mega preprocess``: with ``--tokenizer-backend auto`` (gigatoken after its self-check) and
  ``reference`` (the tokenizers library whole-text); each run is one ``preprocess()`` call in a
  fresh process, as the CLI makes it, timed there (its imports aside): this process has
  started the libraries' threads by then, and a run from it would start its workers from a
  fork server, which the CLI does not;
- ``mega preprocess --ray`` (with ``--ray``): one ``preprocess_on_ray`` call in a fresh process,
  timed from when its local Ray cluster of ``workers`` CPUs (on loopback) is up, the input cut
  into ``2 x workers`` shards; its output is compared byte for byte with mega preprocess's.

Each corpus is ``--size-mb`` of jsonl (a corpus that runs out is repeated), large enough that
start-up (imports, the backend's self-check, the pool) is a small share for the fast contenders
(gigatoken bulk, mega preprocess); the slow ones (the seed tool, megatron-core, tokenizers alone,
mega preprocess with the reference backend) run on its first ``--prefix-mb`` only, said in their
row. MB/s is the input's size over the wall time, tokens/s the output's tokens over it; the median
of ``--rounds`` alternating rounds is reported. mega preprocess also runs on the prefix (not
timed), and its output there and the seed tool's (else megatron-core's) are compared byte for
byte in every round. Files go to ``build/bench/tokenize``.
"""

from __future__ import annotations

import contextlib
import filecmp
import json
import math
import shutil
import statistics
import subprocess
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
#: mega preprocess on the prefix: not timed, its output compared with the slow tools'
PREFIX_RUN = "mega preprocess, prefix"
PREFIX_OUT = "ours-prefix/out_text_document"
RAY_RUN = "mega preprocess --ray"


def make_corpus(path: Path, size_mb: float, corpus: str) -> int:
    """``size_mb`` MB of ``corpus`` as jsonl, its documents repeated where it runs out; the
    line count."""
    lines = bench_preprocess.make_input(path, size_mb, corpus)
    once = path.read_bytes()
    copies = max(1, math.ceil(size_mb * 1e6 / len(once)))
    path.write_bytes(once * copies)
    return lines * copies


def make_prefix(source: Path, prefix: Path, size_mb: float) -> None:
    """The whole lines of ``source`` within its first ``size_mb`` MB (at least one)."""
    data = source.read_bytes()
    cut = data.rfind(b"\n", 0, int(size_mb * 1e6)) + 1 or data.find(b"\n") + 1
    prefix.write_bytes(data[:cut])


def token_count(prefix: str) -> int:
    return int(IndexedDataset(prefix).sequence_lengths.sum())


def timed(run: Callable[[], object]) -> float:
    """The seconds ``run`` takes, or those it says it took (a run in another process)."""
    start = time.perf_counter()
    said = run()
    return said if isinstance(said, float) else time.perf_counter() - start


#: one run in its own process, timed there (imports aside): input, output prefix, model,
#: backend, workers, shard bytes. Shard bytes 0: one ``preprocess()`` call; else one
#: ``preprocess_on_ray()`` call in shards of that size, timed once its local Ray cluster (CPUs:
#: workers, on loopback) is up
PREPROCESS_ALONE = """
import sys, time
from megafmt.preprocess import PreprocessConfig, preprocess
from megafmt.tokenizers import TokenizerOptions
source, prefix, model, backend, workers, shard_bytes = sys.argv[1:]
config = PreprocessConfig(source, prefix, "HuggingFaceTokenizer",
    TokenizerOptions(model=model, backend=backend), append_eod=True, workers=int(workers),
    log_interval=10**9)
if int(shard_bytes):
    import ray
    from megafmt.preprocess.on_ray import RayOptions, preprocess_on_ray
    ray.init(num_cpus=int(workers), include_dashboard=False, log_to_driver=False,
        _node_ip_address="127.0.0.1")
    start = time.perf_counter()
    preprocess_on_ray(config, RayOptions(shard_bytes=int(shard_bytes)))
else:
    start = time.perf_counter()
    preprocess(config)
print(time.perf_counter() - start)
"""


#: gigatoken's bulk call in its own process, timed as PREPROCESS_ALONE times a run (imports
#: aside; the tokenizer's load and a cold pretoken cache included): jsonl, tokenizer.json, workers
GIGATOKEN_ALONE = """
import sys, time
import gigatoken
source, model, workers = sys.argv[1:]
start = time.perf_counter()
with open(model, encoding="utf-8") as stream:
    tokenizer = gigatoken.Tokenizer.from_json(stream.read())
tokenizer.encode_files(gigatoken.JsonlFileSource([source]), parallel=int(workers) > 1)
print(time.perf_counter() - start)
"""


def in_own_process(script: str, *argv: str) -> Callable[[], float]:
    """A run of ``script`` in a fresh interpreter, which prints the seconds it took."""

    def run() -> float:
        command = [sys.executable, "-c", script, *argv]
        done = subprocess.run(command, check=True, capture_output=True, text=True)
        return float(done.stdout.split()[-1])

    return run


def contenders(
    work: Path, source: Path, prefix: Path, workers: int, seed: SeedProcess | None, ray: bool
) -> dict:
    """Each contender's run for ``workers``, its input (``source`` or its ``prefix``) and where
    it writes its output (None: none)."""
    options = TokenizerOptions(model=str(work))
    texts = [json.loads(line)["text"] for line in prefix.open(encoding="utf-8")]
    import gigatoken
    import tokenizers

    library = tokenizers.Tokenizer.from_file(str(work / "tokenizer.json"))
    fast = gigatoken.Tokenizer.from_json((work / "tokenizer.json").read_text())

    def library_alone() -> None:
        library.encode_batch_fast(texts, add_special_tokens=False)

    def gigatoken_bulk() -> None:
        fast.encode_files(gigatoken.JsonlFileSource([str(source)]), parallel=workers > 1)

    def ours(backend: str, text: Path, folder: str, shard_bytes: int = 0) -> Callable[[], float]:
        argv = [str(text), str(work / folder / "out"), str(work), backend, str(workers)]
        return in_own_process(PREPROCESS_ALONE, *argv, str(shard_bytes))

    flags = ["--input", str(prefix), "--tokenizer-type", "HuggingFaceTokenizer",
             "--tokenizer-model", str(work), "--workers", str(workers), "--append-eod",
             "--log-interval", str(10**9)]  # fmt: skip
    runs = {}
    if seed is not None:
        seed_out = work / "seed" / "out"
        runs["seed tool"] = (
            lambda: seed.call(
                "seed_tokenizers:preprocess_data", [*flags, "--output-prefix", str(seed_out)]
            ),
            prefix,
            f"{seed_out}_text_document",
        )
    run_core = bench_preprocess.reference_tool(
        "HuggingFaceTokenizer", options, prefix, work / "core" / "out", workers
    )
    runs["megatron-core 0.16.1"] = (run_core, prefix, f"{work}/core/out_text_document")
    runs["tokenizers alone"] = (library_alone, prefix, None)
    runs["gigatoken bulk"] = (gigatoken_bulk, source, None)
    tokenizer_json = str(work / "tokenizer.json")
    runs["gigatoken bulk (fresh process)"] = (
        in_own_process(GIGATOKEN_ALONE, str(source), tokenizer_json, str(workers)),
        source,
        None,
    )
    runs["mega preprocess (reference)"] = (ours("reference", prefix, "ours-ref"), prefix, None)
    runs["mega preprocess"] = (ours("auto", source, "ours-auto"), source, None)
    if ray:
        shard_bytes = -(-source.stat().st_size // (2 * workers))
        runs[RAY_RUN] = (ours("auto", source, "ours-ray", shard_bytes), source, None)
    runs[PREFIX_RUN] = (ours("auto", prefix, "ours-prefix"), prefix, f"{work}/{PREFIX_OUT}")
    return runs


def bench_corpus(corpus: str, args, report: benchreport.Report, seed) -> list[str]:
    """The table rows of one corpus."""
    work = ROOT / "build" / "bench" / "tokenize"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    source, prefix = work / "input.jsonl", work / "prefix.jsonl"
    lines = make_corpus(source, args.size_mb, corpus)
    make_prefix(source, prefix, args.prefix_mb)
    bench_preprocess.train_tokenizer(work, source, args.vocab_size)
    size = {source: source.stat().st_size / 1e6, prefix: prefix.stat().st_size / 1e6}
    conditions = (
        f"{corpus}, {lines:,} documents, {size[source]:.3g} MB (slow tools: the first "
        f"{size[prefix]:.3g} MB), vocab {args.vocab_size}"
    )
    report.heading(f"tokenize: {conditions}")
    rows = []
    for workers in args.workers:
        runs = contenders(work, source, prefix, workers, seed, args.ray)
        seconds: dict[str, list[float]] = {name: [] for name in runs}
        same = ray_same = True  # in every round
        for _ in range(args.rounds):
            for folder in ("seed", "core", "ours-auto", "ours-ref", "ours-prefix", "ours-ray"):
                shutil.rmtree(work / folder, ignore_errors=True)
                (work / folder).mkdir()
            for name, (run, _, _) in runs.items():
                seconds[name].append(timed(run))
            theirs = runs["seed tool" if seed else "megatron-core 0.16.1"][2]
            same &= all(
                filecmp.cmp(runs[PREFIX_RUN][2] + x, theirs + x, shallow=False)
                for x in (".bin", ".idx")
            )
            if args.ray:
                ray_same &= all(
                    filecmp.cmp(
                        f"{work}/ours-ray/out_text_document{x}",
                        f"{work}/ours-auto/out_text_document{x}",
                        shallow=False,
                    )
                    for x in (".bin", ".idx")
                )
        del seconds[PREFIX_RUN]
        tokens = {
            source: int(
                IndexedDataset(f"{work}/ours-auto/out_text_document").sequence_lengths.sum()
            ),
            prefix: int(IndexedDataset(str(work / PREFIX_OUT)).sequence_lengths.sum()),
        }
        rate = {name: size[runs[name][1]] / statistics.median(t) for name, t in seconds.items()}
        for name, megabytes_per_second in rate.items():
            text = runs[name][1]
            label = name if text == source else f"{name} (first {size[prefix]:.3g} MB)"
            rows.append(
                f"| {corpus} | {workers} | {label} | {megabytes_per_second:.2f} | "
                f"{megabytes_per_second * tokens[text] / size[text] / 1e6:.2f} | "
                f"{rate['mega preprocess'] / megabytes_per_second:.2f}x |"
            )
            print(rows[-1], flush=True)
        for name, reference in (("megatron-core 0.16.1", "megatron-core"), ("seed tool", "seed")):
            if name in rate:
                benchreport.Report("tokenize", reference, args.rows).compare(
                    f"tokenize {corpus}, {workers} workers",
                    ours=rate["mega preprocess"],
                    theirs=rate[name],
                    unit="MB/s",
                    higher_is_better=True,
                    conditions=conditions,
                )
        report.note(
            f"{tokens[source]:,} tokens; mega preprocess and "
            f"{'the seed tool' if seed else 'megatron-core'} byte-identical on the prefix: "
            f"{'yes' if same else 'NO'}; gigatoken bulk's MB/s / mega preprocess's: "
            f"{rate['gigatoken bulk'] / rate['mega preprocess']:.2f}x"
            + (f"; --ray byte-identical with it: {'yes' if ray_same else 'NO'}" if args.ray else "")
        )
    shutil.rmtree(work, ignore_errors=True)
    return rows


def main() -> None:
    parser = benchreport.parser(__doc__)
    parser.add_argument("--size-mb", type=float, default=20)
    parser.add_argument("--prefix-mb", type=float, default=2)
    parser.add_argument("--vocab-size", type=int, default=8192)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--ray", action="store_true", help="add mega preprocess --ray")
    parser.add_argument(
        "--corpora",
        nargs="+",
        choices=sorted(bench_preprocess.CORPORA),
        default=["prose", "code", "multilingual", "synthetic"],
    )
    args = parser.parse_args()
    report = benchreport.Report("tokenize", REFERENCE, args.rows)
    rows = ["| corpus | workers | contender | MB/s | M tokens/s | mega preprocess's MB/s / its |",
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

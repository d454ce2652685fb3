"""The walkthrough's 7B configuration (section 8) at full size: megaindex against the seed.

    .venv/bin/python tools/bench/bench_scale.py [--scale 1.0] [--workdir build/bench_scale]
        [--hit-processes 8] [--rows FILE]

The corpus: 146.5M documents (x ``--scale``) of lognormal lengths with a mean of about 2048
tokens, int32 tokens (a 128,256-token vocabulary), so about 300G tokens. Only the ``.idx`` is
written (vectorised, in chunks, with progress; ~2.9 GB at full size); the ``.bin`` is a sparse
file of the size the index implies, since building the tables never reads a token.

The run: global batch 1024 x 20,000 iterations (x ``--scale``) = 20.48M training samples of
4096 tokens, split ``969,30,1`` (Megatron's default), and the valid and test sample counts of
Megatron's default budget (``--eval-interval 1000``, ``--eval-iters 100``, as
``megaindex.budget`` computes them). The seed commit's code (Megatron-LM e03878b5f, entered
with ``testing/seedref.py``) and megaindex each build all three splits in a fresh process of
their own, one after the other (each side's dataset classes imported before the clock
starts): build seconds and the process's peak RSS (``VmHWM``). Then the tables are compared by
SHA-256 (dtype, shape and bytes), their sizes are printed next to the walkthrough's estimates,
and 8 processes per side open the cache at the same moment (each already imported; the time
from the common start until the last one holds its datasets and has read its first training
sample: megaindex maps a cache hit's tables when a sample first reads them).

Everything goes to ``--workdir`` (default ``build/bench_scale``) and is deleted at the end
unless ``--keep``. Every figure goes through ``benchreport`` (``--rows`` for ``run_all.py``'s
table); the sample counts and the tables' identity are printed as notes.
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import benchreport
import numpy

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_WORKDIR = ROOT / "build" / "bench_scale"
#: section 8 of the walkthrough
DOCUMENTS = 146_500_000
MEAN_LENGTH = 2048
VOCAB = 128_256
GLOBAL_BATCH = 1024
TRAIN_ITERS = 20_000
SEQUENCE_LENGTH = 4096
SPLIT = "969,30,1"
#: Megatron-LM's defaults for --eval-interval and --eval-iters
EVAL_INTERVAL = 1000
EVAL_ITERS = 100
TABLES = ("document_index", "sample_index", "shuffle_index")
SPLITS = ("train", "valid", "test")
SIDES = ("seed", "megaindex")
#: the one reference: the seed commit's code, entered by the seed side's own process
REFERENCES = ("seed",)
HIT_PROCESSES = 8
CHUNK = 1 << 24  # index entries per write


@dataclass(frozen=True)
class Plan:
    """What one run builds: the corpus size and the three splits' sample counts."""

    documents: int
    train_iters: int
    sizes: tuple[int, int, int]

    @classmethod
    def at_scale(cls, scale: float) -> Plan:
        from megaindex.budget import get_train_valid_test_num_samples

        iterations = max(1, round(TRAIN_ITERS * scale))
        sizes = get_train_valid_test_num_samples(
            GLOBAL_BATCH,
            train_iters=iterations,
            eval_interval=EVAL_INTERVAL,
            eval_iters=EVAL_ITERS,
        )
        return cls(max(1000, round(DOCUMENTS * scale)), iterations, sizes)

    def estimates(self) -> dict[str, int]:
        """The walkthrough's estimates of the training tables, in bytes: one int32 per
        document, two per training sample (and one), one per training sample."""
        return {
            "document_index": 4 * self.documents,
            "sample_index": 4 * 2 * (self.sizes[0] + 1),
            "shuffle_index": 4 * self.sizes[0],
        }


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def write_corpus(prefix: Path, documents: int, seed: int = 0) -> int:
    """A one-sequence-per-document int32 ``.idx`` of lognormal lengths (mean ~2048), written in
    chunks, and a sparse ``.bin`` of the implied size; returns the token count."""
    from megafmt.dtypes import DType
    from megafmt.format import HEADER_SIZE, Header

    rng = numpy.random.default_rng(seed)
    sigma = 1.0
    mu = math.log(MEAN_LENGTH) - sigma * sigma / 2
    idx_path = prefix.with_suffix(".idx")
    itemsize = numpy.dtype(numpy.int32).itemsize
    started = time.perf_counter()
    with open(idx_path, "wb") as stream:
        stream.write(Header(DType.code_from_dtype(numpy.int32), documents, documents + 1).pack())
        for start in range(0, documents, CHUNK):
            count = min(CHUNK, documents - start)
            lengths = rng.lognormal(mu, sigma, count).clip(1, 1 << 20).astype("<i4")
            stream.write(memoryview(lengths))
            progress(f"  .idx lengths {start + count:,}/{documents:,}")
        stream.flush()
        lengths = numpy.memmap(idx_path, dtype="<i4", mode="r", offset=HEADER_SIZE, shape=documents)
        pointer = 0
        for start in range(0, documents, CHUNK):
            chunk = lengths[start : start + CHUNK].astype("<i8")
            ends = numpy.cumsum(chunk, out=chunk)
            pointers = numpy.empty_like(ends)
            pointers[0] = pointer
            pointers[1:] = ends[:-1] + pointer
            pointer += int(ends[-1])
            stream.write(memoryview(pointers * itemsize))
            progress(f"  .idx pointers {start + len(chunk):,}/{documents:,}")
        del lengths
        for start in range(0, documents + 1, CHUNK):
            stream.write(
                memoryview(numpy.arange(start, min(start + CHUNK, documents + 1), dtype="<i8"))
            )
    with open(prefix.with_suffix(".bin"), "wb") as stream:
        stream.truncate(pointer * itemsize)
    progress(
        f"  corpus written in {time.perf_counter() - started:.1f} s: {documents:,} documents, "
        f"{pointer / 1e9:.1f}G tokens, .idx {idx_path.stat().st_size / 1e9:.2f} GB, "
        f".bin {pointer * itemsize / 1e12:.2f} TB (sparse)"
    )
    return pointer


def tokenizer_of(side: str, identity: dict | None) -> object:
    """The seed commit's NullTokenizer(128256); for megaindex, a tokenizer that carries the
    identity the seed's reported (its EOD, vocabulary size and cache identifiers), as a job
    building its cache offline would."""
    if side == "seed":
        from megatron.core.tokenizers.text.libraries.null_tokenizer import NullTokenizer

        return NullTokenizer(VOCAB)
    from megaindex.tokenizer import IdentifiedTokenizer

    if identity is None:
        raise ValueError("megaindex's side needs the identity of the seed's tokenizer")
    return IdentifiedTokenizer(identity["eod"], identity["vocab_size"], identity["identifiers"])


def build_datasets(side: str, prefix: str, cache: str, sizes: list[int], tokenizer) -> list:
    """The three GPT datasets of the seed commit's or megaindex's builder (built or loaded)."""
    if side == "seed":
        from megatron.core.datasets.blended_megatron_dataset_builder import (
            BlendedMegatronDatasetBuilder,
        )
        from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
    else:
        from megaindex import BlendedMegatronDatasetBuilder, GPTDataset, GPTDatasetConfig

    config = GPTDatasetConfig(
        random_seed=1234,
        sequence_length=SEQUENCE_LENGTH,
        blend=([prefix], None),
        split=SPLIT,
        tokenizer=tokenizer,
        path_to_cache=cache,
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
    )
    return BlendedMegatronDatasetBuilder(GPTDataset, sizes, lambda: True, config).build()


def peak_rss_mib() -> float:
    """This process's peak resident set (``VmHWM``, reset at exec, unlike ``ru_maxrss``, which
    keeps the parent's peak from before the fork), in MiB."""
    with open("/proc/self/status") as stream:
        for line in stream:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("/proc/self/status has no VmHWM line")


def child(
    side: str, prefix: str, cache: str, sizes: list[int], wait: bool, identity: dict | None
) -> None:
    """One side's build (or cache-hit open) in this fresh process; prints one JSON line.

    With ``wait``, prints ``ready`` once imported and starts when a line arrives on stdin, so
    that several processes start together."""
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    if side == "seed":
        sys.path.insert(0, str(ROOT / "testing"))
        from seedref import enter_seed_environment

        enter_seed_environment()
        import megatron.core.datasets.blended_megatron_dataset_builder
        import megatron.core.datasets.gpt_dataset  # noqa: F401
    else:
        # megaindex's names are imported when first used: used here, before the clock starts,
        # so that neither side's figures hold torch's import (a training process has imported
        # torch long before it builds its datasets)
        from megaindex import BlendedMegatronDatasetBuilder, GPTDataset  # noqa: F401
    tokenizer = tokenizer_of(side, identity)
    baseline = peak_rss_mib()
    if wait:
        print("ready", flush=True)
        sys.stdin.readline()
    started = time.time()
    splits = build_datasets(side, prefix, cache, sizes, tokenizer)
    # a cache hit's start-up is timed to the first training sample (megaindex maps a hit's
    # tables when a sample first reads them); a build's figures are the build's alone
    if wait:
        splits[0][0]
    finished = time.time()
    peak = peak_rss_mib()
    answer = {
        "seconds": finished - started,
        "finished": finished,
        "peak_mib": peak,
        "baseline_mib": baseline,
        "samples": [len(split) for split in splits],
        "tokenizer": {
            "eod": int(tokenizer.eod),
            "vocab_size": int(tokenizer.vocab_size),
            "identifiers": dict(tokenizer.unique_identifiers),
        },
    }
    print(json.dumps(answer), flush=True)


def child_command(
    side: str, prefix: Path, cache: Path, sizes: tuple, wait: bool, identity: dict | None
) -> list[str]:
    return [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        side,
        str(prefix),
        str(cache),
        ",".join(str(size) for size in sizes),
        "wait" if wait else "go",
        json.dumps(identity),
    ]


def build_side(side: str, prefix: Path, cache: Path, sizes: tuple, identity: dict | None) -> dict:
    """One side builds its tables in a fresh process."""
    output = subprocess.run(
        child_command(side, prefix, cache, sizes, False, identity),
        check=True,
        stdout=subprocess.PIPE,
        text=True,
    ).stdout
    return json.loads(output.strip().splitlines()[-1])


def cache_hit_startup(
    side: str, prefix: Path, cache: Path, sizes: tuple, count: int, identity: dict | None
) -> dict:
    """``count`` processes, imported and waiting, open the cache at one moment: seconds from
    that moment until the last holds its datasets and has read its first training sample, and
    the slowest one's own time."""
    processes = [
        subprocess.Popen(
            child_command(side, prefix, cache, sizes, True, identity),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(count)
    ]
    try:
        for process in processes:
            if process.stdout.readline().strip() != "ready":
                raise RuntimeError(f"a {side} start-up process failed before it was ready")
        started = time.time()
        for process in processes:
            process.stdin.write("go\n")
            process.stdin.flush()
        answers = [json.loads(process.stdout.readline()) for process in processes]
    finally:
        for process in processes:
            process.stdin.close()
            process.wait(timeout=600)
    return {
        "wall": max(answer["finished"] for answer in answers) - started,
        "slowest": max(answer["seconds"] for answer in answers),
        "peak_mib": max(answer["peak_mib"] for answer in answers),
    }


def table_digest(path: Path) -> str:
    """SHA-256 of an ``.npy`` table's dtype, shape and bytes, read in chunks."""
    array = numpy.load(path, mmap_mode="r")
    digest = hashlib.sha256(f"{array.dtype.str}{array.shape}".encode())
    flat = array.reshape(-1)
    step = max(1, (64 << 20) // max(1, array.itemsize))
    for start in range(0, len(flat), step):
        digest.update(numpy.ascontiguousarray(flat[start : start + step]).data)
    return digest.hexdigest()


def cache_tables(cache: Path) -> dict[tuple[str, str], Path]:
    """``(split, table) -> file`` of a GPTDataset cache folder."""
    found = {}
    for path in sorted(cache.rglob("*.npy")):
        _, _, split, table = path.stem.split("-", 3)
        found[(split, table)] = path
    return found


def compare_tables(caches: dict[str, Path]) -> dict[tuple[str, str], dict]:
    """Per split and table: each side's digest and size, and the file names (md5 included)."""
    per_side = {side: cache_tables(caches[side]) for side in SIDES}
    keys = sorted(set(per_side["seed"]) | set(per_side["megaindex"]))
    compared = {}
    for key in keys:
        entry = {}
        for side in SIDES:
            path = per_side[side].get(key)
            entry[side] = None if path is None else (table_digest(path), path.name)
        array = numpy.load(per_side["megaindex"][key], mmap_mode="r")
        entry["nbytes"] = array.nbytes
        entry["shape"] = array.shape
        entry["dtype"] = str(array.dtype)
        compared[key] = entry
    return compared


def conditions_of(results: dict) -> str:
    """What a figure of this run was measured on, for the table."""
    plan = results["plan"]
    return (
        f"walkthrough section 8 at scale {results['scale']:g}: {plan.documents:,} documents, "
        f"{results['tokens'] / 1e9:.1f}G int32 tokens, samples (train, valid, test) "
        f"{plan.sizes} of {SEQUENCE_LENGTH}, split {SPLIT}, fresh process per side"
    )


#: (figure, field of a side's answer, unit): the build's figures and the cache-hit start-up's
BUILD_FIGURES = (
    ("build seconds, 3 splits (target >= 3x)", "seconds", "s"),
    ("peak RSS of the building process (target >= 2x)", "peak_mib", "MiB"),
    ("peak RSS of the build above the imports", "above_mib", "MiB"),
)
HIT_FIGURES = (
    ("cache-hit start-up, until the last process has read its first sample", "wall", "s"),
    ("cache-hit start-up, the slowest process's own open and first read", "slowest", "s"),
    ("cache-hit start-up, peak RSS of one opening process", "peak_mib", "MiB"),
)


def compare_figures(
    report: benchreport.Report, figures: tuple, ours: dict, seed: dict, conditions: str
) -> None:
    """Each of ``figures`` (lower is better), ours against the seed's."""
    for figure, field, unit in figures:
        report.compare(
            figure, ours=ours[field], theirs=seed[field], unit=unit, conditions=conditions
        )


def report_results(report: benchreport.Report, results: dict) -> None:
    """Every figure of ``results`` through ``report``: the timings and peaks against the seed's,
    the sample counts and the tables' identity as notes."""
    seed, ours = results["build"]["seed"], results["build"]["megaindex"]
    conditions = conditions_of(results)
    report.heading(f"index build of 3 splits: {conditions}")
    for side in (seed, ours):
        side["above_mib"] = side["peak_mib"] - side["baseline_mib"]
    compare_figures(report, BUILD_FIGURES, ours, seed, conditions)
    same = "equal" if seed["samples"] == ours["samples"] else "DIFFERENT"
    report.note(f"samples (train, valid, test): seed {seed['samples']}, ours {ours['samples']}")
    report.note(f"sample counts {same}")
    for (split, table), entry in results["tables"].items():
        identical = entry["seed"] is not None and entry["seed"] == entry["megaindex"]
        note = "identical (sha256, same file name)" if identical else "DIFFERENT"
        estimate = results["plan"].estimates().get(table) if split == "train" else None
        if estimate is not None:
            note += f"; walkthrough's estimate {estimate / 1e6:.1f} MB"
        size = f"{entry['nbytes'] / 1e6:.1f} MB {entry['dtype']}{list(entry['shape'])}"
        report.note(f"{split} {table}: {size}: {note}")
    report.note(f"all tables identical: {tables_identical(results)}")
    if not results["hits"]:
        return
    seed_hit, ours_hit = results["hits"]["seed"], results["hits"]["megaindex"]
    hit_conditions = f"{conditions}; {results['hit_processes']} processes open the cache at once"
    compare_figures(report, HIT_FIGURES, ours_hit, seed_hit, hit_conditions)


def available_gib() -> float:
    with open("/proc/meminfo") as stream:
        for line in stream:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 2**20
    return float("nan")


def run(scale: float, workdir: Path, hit_processes: int = HIT_PROCESSES) -> dict:
    """The whole benchmark in ``workdir``; returns what ``report_results`` states."""
    plan = Plan.at_scale(scale)
    workdir.mkdir(parents=True, exist_ok=True)
    prefix = workdir / "corpus"
    progress(
        f"scale {scale}: {plan.documents:,} documents, {plan.train_iters:,} iterations of "
        f"{GLOBAL_BATCH}, samples (train, valid, test) {plan.sizes}, split {SPLIT}; "
        f"{available_gib():.1f} GiB available"
    )
    tokens = write_corpus(prefix, plan.documents)
    caches = {side: workdir / f"cache_{side}" for side in SIDES}
    results: dict = {"scale": scale, "plan": plan, "tokens": tokens, "build": {}, "hits": {}}
    identity = None  # the seed's tokenizer's, once it has built (it builds first)
    for side in SIDES:
        progress(f"{side}: building the tables ({available_gib():.1f} GiB available)")
        results["build"][side] = build_side(side, prefix, caches[side], plan.sizes, identity)
        identity = results["build"][side]["tokenizer"]
        progress(f"{side}: {results['build'][side]}")
    progress("hashing the tables")
    results["tables"] = compare_tables(caches)
    results["hit_processes"] = hit_processes
    for side in SIDES if hit_processes else ():
        progress(f"{side}: {hit_processes} processes open the cache at once")
        results["hits"][side] = cache_hit_startup(
            side, prefix, caches[side], plan.sizes, hit_processes, identity
        )
    return results


def tables_identical(results: dict) -> bool:
    """Every table both sides built is the same array in a file of the same name."""
    return all(
        entry["seed"] is not None and entry["seed"] == entry["megaindex"]
        for entry in results["tables"].values()
    )


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        side, prefix, cache, sizes, mode, identity = sys.argv[2:8]
        sizes_list = [int(size) for size in sizes.split(",")]
        child(side, prefix, cache, sizes_list, mode == "wait", json.loads(identity))
        return
    parser = benchreport.parser(__doc__, choices=REFERENCES)
    parser.add_argument("--scale", type=float, default=1.0, help="fraction of the full size")
    parser.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR)
    parser.add_argument(
        "--hit-processes", type=int, default=HIT_PROCESSES, help="0: no cache-hit start-up"
    )
    parser.add_argument("--keep", action="store_true", help="keep the corpus and the caches")
    args = parser.parse_args()
    report = benchreport.Report("scale", args.reference, args.rows)
    marker = args.workdir / ".bench_scale"  # only a folder this script made is ever deleted
    if args.workdir.exists() and any(args.workdir.iterdir()) and not marker.exists():
        raise SystemExit(f"--workdir {args.workdir}: not empty and not made by bench_scale.py")
    shutil.rmtree(args.workdir, ignore_errors=True)
    args.workdir.mkdir(parents=True)
    marker.touch()
    try:
        results = run(args.scale, args.workdir, args.hit_processes)
    finally:
        if not args.keep:
            shutil.rmtree(args.workdir, ignore_errors=True)
    report_results(report, results)


if __name__ == "__main__":
    main()

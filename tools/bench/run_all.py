"""Every benchmark of tools/bench/, each against every reference it has, into one markdown table.

    .venv/bin/python tools/bench/run_all.py [--quick] [--only megafmt,fim] [--output FILE]

(or ``tools/bench/run_all``, or ``make bench``). Each benchmark script runs in a process of its
own, once per reference: megatron-core (the installed release) and Megatron-LM at the seed commit
(the script imports the seed's ``megatron`` through testing/seedref.py's environment), or the one
reference a benchmark has where the other does not ship the code measured. Their output streams
here as they run; each appends its figures (benchreport.Row) to a rows file, and the table
(figure, ours, reference, ratio, conditions, date, machine) is written to ``--output``, default
docs/benchmarks.md. Every figure a script states is in the table, unfavourable ones included.

The sizes here are the ones ``make bench`` uses, chosen so the whole run takes about half an
hour on a 2-core machine, plus about 6 minutes for bench_scale's full size, the one that
matters there (each other script's own defaults are larger); ``--quick`` runs the smallest
sizes, a smoke test of the scripts and the table, whose figures say little.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import benchreport

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "testing"))
from seedref import seed_unavailable  # noqa: E402  (test support, beside the benchmarks)

DEFAULT_OUTPUT = ROOT / "docs" / "benchmarks.md"
BOTH = ("megatron-core", "seed")


@dataclass(frozen=True)
class Benchmark:
    """One script of tools/bench/, the references it runs against, and its arguments."""

    name: str
    references: tuple[str, ...]
    arguments: str
    quick: str

    @property
    def script(self) -> Path:
        return ROOT / "tools" / "bench" / f"bench_{self.name}.py"


BENCHMARKS = (
    Benchmark(
        "megafmt",
        BOTH,
        "--tokens 20e6 --documents 40e3 --repeats 1 --merge-documents 1e6",
        "--tokens 2e5 --documents 2e3 --repeats 1 --merge-documents 1e4 --reads 2000 "
        "--read-documents 2000",
    ),
    Benchmark("megaindex", BOTH, "--documents 5e6", "--documents 2e4 --hits 1"),
    Benchmark("megaload", BOTH, "--batches 100", "--batches 4"),
    Benchmark(
        "megadist", ("megatron-protocol",), "--iterations 10", "--iterations 2 --seq-length 256"
    ),
    Benchmark("preprocess", BOTH, "--size-mb 20", "--size-mb 0.3 --vocab-size 600"),
    Benchmark(
        "tokenize",
        ("megatron-core",),
        "--size-mb 4 --rounds 3",
        "--size-mb 0.2 --rounds 1 --vocab-size 600 --workers 1 --corpora multilingual",
    ),
    Benchmark(
        "s3",
        BOTH,
        "--megabytes 32 --samples 200",
        "--megabytes 2 --samples 10 --latency-ms 1",
    ),
    Benchmark("fim", ("seed",), "--samples 200", "--samples 5 --documents 50 --seq-length 256"),
    Benchmark("sft_jsonl", ("seed-datasets",), "--size-mb 200", "--size-mb 1"),
    Benchmark("scale", ("seed",), "--scale 1", "--scale 1e-5 --hit-processes 1"),
    Benchmark(
        "thousands",
        ("megatron-core",),
        "--corpora 2400 --samples 200000 --nodes 8 --per-node 8",
        "--corpora 20 --samples 2000 --nodes 1 --per-node 2",
    ),
)


def machine() -> str:
    """This machine in a few words: CPU model, cores, memory."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as stream:
            for line in stream:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{os.cpu_count()} x {model}, {memory:.0f} GiB"


def run_benchmark(benchmark: Benchmark, reference: str, quick: bool, rows: Path) -> float:
    """Run one script against one reference, its output streaming here; its seconds."""
    command = [
        sys.executable,
        str(benchmark.script),
        "--reference",
        reference,
        "--rows",
        str(rows),
        *(benchmark.quick if quick else benchmark.arguments).split(),
    ]
    print(f"\n=== bench_{benchmark.name} against {reference}: {' '.join(command[1:])}", flush=True)
    start = time.perf_counter()
    subprocess.run(command, check=True, cwd=ROOT)
    return time.perf_counter() - start


def cell(text: str) -> str:
    return text.replace("|", "\\|")


def value(number: float, unit: str) -> str:
    return f"{number:,.3g} {unit}" if abs(number) < 1000 else f"{number:,.0f} {unit}"


def table(rows: list[benchreport.Row], date: str, host: str) -> str:
    """The markdown table of ``rows``, one line per figure, in the order they were measured."""
    lines = [
        "| figure | ours | reference | ratio | conditions | date | machine |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            "| "
            + " | ".join(
                cell(text)
                for text in (
                    f"{row.benchmark}: {row.figure}",
                    value(row.ours, row.unit),
                    f"{value(row.theirs, row.unit)} ({row.reference})",
                    row.ratio_text,
                    row.conditions,
                    date,
                    host,
                )
            )
            + " |"
        )
    return "\n".join(lines) + "\n"


def document(
    rows: list[benchreport.Row],
    quick: bool,
    load: tuple[float, ...],
    seconds: float,
    left_out: str = "",
) -> str:
    """The whole markdown file: what was run, how to read it, what was left out, the table."""
    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d")
    host = machine()
    size = "`--quick` (smoke-test sizes: these figures say little)" if quick else "`make bench`"
    return (
        "# Benchmarks: this project against Megatron-LM, on one machine, in one run\n\n"
        f"Written by `tools/bench/run_all.py` ({size}) on {date}, in {seconds / 60:.0f} minutes. "
        f"Machine: {host}; load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} "
        "(1 / 5 / 15 minutes) when the run began: other work on the machine slows both "
        "sides, not always equally. Regenerate with `make bench`.\n\n"
        "Each figure is measured for ours and for the reference in the same process run, on the "
        "same input. **ratio** is how many times better ours is: above 1 ours is faster (or "
        "smaller), below 1 it is slower. References: megatron-core "
        f"{benchreport.reference_label('megatron-core').split()[-1]} from PyPI, and Megatron-LM "
        f"at the seed commit {benchreport.SEED_COMMIT} (its source run in place of "
        "megatron-core's). Where a benchmark has only one reference the other does not ship the "
        "code measured (FIM lives in megatron.training; get_batch's broadcast in "
        "megatron.training.utils, which needs CUDA, so megadist replays its protocol; the SFT "
        "jsonl reader of the seed commit is `datasets.load_dataset`). Every figure the scripts "
        "state is listed, unfavourable ones included; see each script's docstring in "
        "`tools/bench/` for what it measures.\n\n"
        + (f"**Not measured in this run:** {left_out}.\n\n" if left_out else "")
        + table(rows, date, host)
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="smallest sizes: a smoke test")
    parser.add_argument(
        "--only",
        default="",
        help="comma-separated benchmark names (of "
        + ", ".join(b.name for b in BENCHMARKS)
        + "); default all",
    )
    parser.add_argument("--references", default="", help="comma-separated; default each one's all")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    args = parser.parse_args()
    known = {b.name: b for b in BENCHMARKS}
    wanted = [name for name in args.only.split(",") if name] or list(known)
    unknown = sorted(set(wanted) - set(known))
    if unknown:
        parser.error(f"unknown benchmark(s) {unknown}; available: {', '.join(known)}")
    references = {name for name in args.references.split(",") if name}
    runs = [
        (known[name], reference)
        for name in wanted
        for reference in known[name].references
        if not references or reference in references
    ]
    left_out = ""
    missing_seed = seed_unavailable()
    if missing_seed and any(reference == "seed" for _, reference in runs):
        skipped = [f"bench_{b.name}" for b, reference in runs if reference == "seed"]
        runs = [(b, reference) for b, reference in runs if reference != "seed"]
        left_out = f"the seed commit's reference ({', '.join(skipped)}): {missing_seed}"
        print(f"skipping {left_out}", flush=True)
    load = os.getloadavg()
    start = time.perf_counter()
    durations = []
    with tempfile.TemporaryDirectory(prefix="bench_rows") as folder:
        rows_file = Path(folder) / "rows.jsonl"
        rows_file.touch()
        for benchmark, reference in runs:
            seconds = run_benchmark(benchmark, reference, args.quick, rows_file)
            durations.append((f"bench_{benchmark.name} against {reference}", seconds))
        rows = benchreport.read_rows(rows_file)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(
        document(rows, args.quick, load, time.perf_counter() - start, left_out), encoding="utf-8"
    )
    print(f"\n{len(rows)} figures written to {args.output}")
    for what, seconds in durations:
        print(f"  {what}: {seconds:.0f} s")


if __name__ == "__main__":
    main()

"""``mega preprocess --ray`` with 1, 2 and 4 Ray workers against the one-machine run.

    .venv/bin/python tools/bench/bench_preprocess_ray.py [--size-mb 100] [--workers 1 2 4]

The input and tokenizer are bench_preprocess.py's (Zipf pseudo-words, a byte-level BPE
tokenizer.json trained offline). The one-machine run uses ``--workers 1``; each Ray run starts
a local cluster of N CPUs (on loopback) and tokenizes shards of ``--shard-mb`` as Ray tasks.
Prints each run's seconds (a Ray run includes starting its cluster), the throughput, and whether the
output is byte-identical to the one-machine run. Files go to ``build/bench/preprocess_ray``.
"""

from __future__ import annotations

import argparse
import filecmp
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_preprocess import ROOT, make_input, train_tokenizer


def mega_preprocess(source: Path, prefix: Path, tokenizer: Path, *flags: str) -> float:
    """Seconds of one ``mega preprocess`` process, start-up included."""
    command = [
        *(sys.executable, "-m", "megafmt.cli.main", "preprocess"),
        *("--input", str(source), "--output-prefix", str(prefix), "--append-eod"),
        *("--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", str(tokenizer)),
        *("--log-interval", str(10**9), *flags),
    ]
    start = time.perf_counter()
    subprocess.run(command, check=True, env=dict(os.environ, MEGA_PROGRESS="0"))
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=float, default=100)
    parser.add_argument("--shard-mb", type=int, default=8)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--vocab-size", type=int, default=8192)
    args = parser.parse_args()
    work = ROOT / "build" / "bench" / "preprocess_ray"
    shutil.rmtree(work, ignore_errors=True)
    (work / "input").mkdir(parents=True)
    try:
        source = work / "input" / "input.jsonl"
        lines = make_input(source, args.size_mb)
        train_tokenizer(work, source, args.vocab_size)
        megabytes = source.stat().st_size / 1e6
        print(
            f"input: {lines:,} documents, {megabytes:,.0f} MB, shards of {args.shard_mb} MB; "
            f"{os.cpu_count()} CPUs on this machine; HuggingFace BPE, vocab {args.vocab_size}",
            flush=True,
        )
        reference = work / "one" / "out"
        seconds = mega_preprocess(source, reference, work, "--workers", "1")
        print(f"{'one machine, 1 worker':<24} {seconds:7.1f} s  {megabytes / seconds:6.1f} MB/s")
        for workers in args.workers:
            prefix = work / f"ray{workers}" / "out"
            seconds = mega_preprocess(
                source,
                prefix,
                work,
                *("--ray", "--workers", str(workers), "--ray-shard-mb", str(args.shard_mb)),
                # a local cluster of Ray's listens on every interface; accepted for a benchmark
                "--ray-local-any-interface",
            )
            same = all(
                filecmp.cmp(f"{prefix}_text_document{s}", f"{reference}_text_document{s}", False)
                for s in (".bin", ".idx")
            )
            print(
                f"{f'Ray, {workers} worker(s)':<24} {seconds:7.1f} s  "
                f"{megabytes / seconds:6.1f} MB/s  byte-identical: {'yes' if same else 'NO'}",
                flush=True,
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

"""Opening an SFT jsonl: megafmt's line index against the seed commit's ``datasets`` reader.

    .venv/bin/python tools/bench/bench_sft_jsonl.py [--size-mb 1024] [--reads 20000] [--rows FILE]

Writes a jsonl of ``--size-mb`` MB of random conversations (``{"messages": [...]}`` per line).
Each reader then opens it in a fresh process, which reports its wall time and peak resident
memory (``ru_maxrss``), and reads ``--reads`` random lines' messages:

- ``megafmt on-read``: ``JsonlLineIndex(check="on_read")`` indexes from line ends alone (each
  line checked when read); its index is then deleted;
- ``megafmt cold``: ``JsonlLineIndex`` scans and checks every line and writes its index;
- ``megafmt warm``: the same, the index cached beside the file;
- ``datasets cold`` / ``warm``: what the seed commit's ``SFTLowLevelDataset`` does,
  ``datasets.load_dataset("json", data_files=path, split="all")``, with a fresh, then a filled
  cache folder (its Arrow copy of the file).

Files go to ``build/bench/sft`` and are deleted.
"""

from __future__ import annotations

import json
import random
import resource
import shutil
import sys
import time
from pathlib import Path

import benchreport

from megafmt.sft.lines import index_path

ROOT = Path(__file__).resolve().parents[2]
WORK = ROOT / "build" / "bench" / "sft"


def make_input(path: Path, size_mb: float) -> int:
    """Random conversations (a pool of distinct lines, reused in turn); the line count."""
    from megafmt.sft.testing import random_messages

    rng = random.Random(0)
    pool = [
        json.dumps({"messages": random_messages(rng, conversations=3, turns=4)}) + "\n"
        for _ in range(3000)
    ]
    lines, written, limit = 0, 0, size_mb * 1e6
    with open(path, "w", encoding="utf-8") as stream:
        while written < limit:
            line = pool[lines % len(pool)]
            stream.write(line)
            written += len(line)
            lines += 1
    return lines


def child(mode: str, path: str, reads: int, cache: str) -> None:
    """One reader in this process: open, read ``reads`` random lines, report (the import of
    the reader's library is not timed; its memory counts, as it does for a training job)."""
    if mode.startswith("megafmt"):
        from megafmt.sft import JsonlLineIndex

        start = time.perf_counter()
        dataset = JsonlLineIndex(path, check="on_read" if mode == "megafmt-on-read" else "all")

        def messages(i: int) -> list:
            return dataset[i]

    else:
        from datasets import load_dataset

        start = time.perf_counter()
        dataset = load_dataset("json", data_files=path, split="all", cache_dir=cache)

        def messages(i: int) -> list:
            return dataset[i]["messages"]

    opened = time.perf_counter() - start
    rng = random.Random(1)
    picks = [rng.randrange(len(dataset)) for _ in range(reads)]
    start = time.perf_counter()
    turns = sum(len(messages(i)) for i in picks)
    read = time.perf_counter() - start
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        json.dumps(
            {
                "open_s": opened,
                "read_s": read,
                "peak_mb": peak_mb,
                "lines": len(dataset),
                "turns": turns,
            }
        )
    )


def run(mode: str, path: Path, reads: int, cache: Path) -> dict:
    return benchreport.child_json(__file__, mode, path, reads, cache)


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5])
        return
    parser = benchreport.parser(__doc__, choices=("seed-datasets",))
    parser.add_argument("--size-mb", type=float, default=1024)
    parser.add_argument("--reads", type=int, default=20000)
    args = parser.parse_args()
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    try:
        path = WORK / "chat.jsonl"
        start = time.perf_counter()
        lines = make_input(path, args.size_mb)
        size = path.stat().st_size
        conditions = f"jsonl of {size / 1e6:.0f} MB, {lines:,} conversations, fresh process"
        report = benchreport.Report("sft_jsonl", args.reference, args.rows)
        report.heading(f"SFT jsonl: {conditions} (written in {time.perf_counter() - start:.1f} s)")
        cache = WORK / "hf-cache"
        results = {}
        for label, mode in [
            ("megafmt on-read", "megafmt-on-read"),
            ("megafmt cold", "megafmt"),
            ("megafmt warm", "megafmt"),
            ("datasets cold", "datasets"),
            ("datasets warm", "datasets"),
        ]:
            results[label] = found = run(mode, path, args.reads, cache)
            if mode == "megafmt-on-read":
                Path(index_path(str(path))).unlink()
            assert found["lines"] == lines, (label, found["lines"], lines)
            report.note(
                f"{label:<16} open {found['open_s']:8.2f} s  peak {found['peak_mb']:8.0f} MB"
                f"  {args.reads} random reads {found['read_s']:6.2f} s"
            )
        assert results["megafmt warm"]["turns"] == results["datasets warm"]["turns"]
        cases = (
            (
                "first open (no index or cache yet), lines checked on read",
                "megafmt on-read",
                "cold",
            ),
            ("first open (no index or cache yet), every line checked", "megafmt cold", "cold"),
            ("open again (index or cache reused)", "megafmt warm", "warm"),
        )
        for what, ours_label, state in cases:
            ours, theirs = results[ours_label], results[f"datasets {state}"]
            for measure, field, unit in (("time", "open_s", "s"), ("peak memory", "peak_mb", "MB")):
                report.compare(
                    f"SFT jsonl {what}: {measure}",
                    ours=ours[field],
                    theirs=theirs[field],
                    unit=unit,
                    conditions=conditions,
                )
        report.compare(
            "SFT jsonl random reads",
            ours=results["megafmt warm"]["read_s"],
            theirs=results["datasets warm"]["read_s"],
            unit="s",
            conditions=f"{conditions}; {args.reads:,} random lines' messages",
        )
    finally:
        shutil.rmtree(WORK, ignore_errors=True)


if __name__ == "__main__":
    main()

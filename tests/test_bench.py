"""tools/bench/run_all.py at its smoke-test size: every figure of a benchmark, measured against both
references, lands in one markdown table. (Timing figures are not checked: benchmarks print
ratios, tests assert behaviour.)"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools" / "bench"))
import benchreport  # noqa: E402
import run_all  # noqa: E402

RUN_ALL = (sys.executable, str(ROOT / "tools" / "bench" / "run_all.py"))
HEADER = "| figure | ours | reference | ratio | conditions | date | machine |"


def test_the_ratio_says_how_many_times_better_ours_is():
    time = benchreport.Row("b", "build", 2.0, 6.0, "s", "ref", False, "")
    rate = benchreport.Row("b", "reads", 2.0, 6.0, "samples/s", "ref", True, "")
    assert (time.ratio, rate.ratio) == (3.0, 1 / 3)


def test_a_figure_of_zero_makes_the_ratio_undefined_not_a_division_error():
    rows = [
        benchreport.Row("b", "rss above baseline", 0.0, 5.0, "MiB", "ref", False, ""),
        benchreport.Row("b", "reads", 4.0, 0.0, "samples/s", "ref", True, ""),
        benchreport.Row("b", "no reads", 0.0, 4.0, "samples/s", "ref", True, ""),
    ]
    assert [row.ratio for row in rows] == [None, None, 0.0]
    assert [row.ratio_text for row in rows] == ["n/a", "n/a", "0.00x"]
    ratios = [line.split(" | ")[3] for line in run_all.table(rows, "d", "m").splitlines()[2:]]
    assert ratios == ["n/a", "n/a", "0.00x"]
    report = benchreport.Report("b", "megatron-core", None)
    assert report.compare("t", ours=0, theirs=1, unit="s").ratio_text == "n/a"


@pytest.mark.seed
@pytest.mark.slow
def test_run_all_quick_writes_one_table_with_both_references(tmp_path):
    output = tmp_path / "benchmarks.md"
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "tools" / "bench" / "run_all.py"),
            "--quick",
            "--only",
            "megafmt",
            "--output",
            str(output),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = output.read_text(encoding="utf-8").splitlines()
    assert "`--quick`" in lines[2]
    start = lines.index(HEADER)
    rows = [line.strip("| ").split(" | ") for line in lines[start + 2 :]]
    assert rows and all(len(row) == 7 for row in rows)
    labels = [benchreport.reference_label(name) for name in ("megatron-core", "seed")]
    by_reference: dict[str, list[str]] = {label: [] for label in labels}
    for figure, _ours, reference, ratio, conditions, date, machine in rows:
        assert figure.startswith("megafmt: ") and conditions and date and machine
        (label,) = [label for label in labels if reference.endswith(f" ({label})")]
        by_reference[label].append(figure)
        assert float(ratio.rstrip("x")) > 0
    # the same figures against each, reads and builds from every input form and both dtypes
    figures = list(by_reference.values())
    assert figures[0] == figures[1]
    assert sum("build" in f for f in figures[0]) == 2 * 4 * 2  # dtypes x forms x CPU/wall
    assert sum("reader" in f for f in figures[0]) == 4


def test_run_all_refuses_an_unknown_benchmark():
    done = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "bench" / "run_all.py"), "--only", "nonsense"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "unknown benchmark(s) ['nonsense']" in done.stderr


def test_run_all_without_the_seed_archive_says_what_it_left_out(tmp_path):
    output = tmp_path / "benchmarks.md"
    environment = {**os.environ, "MEGATRON_SEED_ARCHIVE": str(tmp_path / "absent.tar.gz")}
    environment.pop("MEGA_REQUIRE_SEED", None)
    done = subprocess.run(
        [*RUN_ALL, "--only", "fim", "--quick", "--output", str(output)],
        capture_output=True,
        text=True,
        timeout=120,
        env=environment,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    said = "the seed commit's reference (bench_fim): the seed commit's source archive"
    assert f"skipping {said}" in done.stdout and "absent.tar.gz" in done.stdout
    text = output.read_text(encoding="utf-8")
    assert f"**Not measured in this run:** {said}" in text
    assert text.rstrip().endswith(HEADER.rstrip() + "\n|---|---|---|---|---|---|---|")

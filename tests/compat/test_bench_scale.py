"""tools/bench/bench_scale.py at a minute scale: both sides build all three splits in processes
of their own, and every table the seed commit's code wrote is identical to megaindex's."""

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "tools" / "bench"
SCRIPT = BENCH / "bench_scale.py"
sys.path.insert(0, str(BENCH))
import benchreport  # noqa: E402


def load_bench():
    spec = importlib.util.spec_from_file_location("bench_scale", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.mark.seed
@pytest.mark.slow
def test_both_sides_build_identical_tables_at_a_minute_scale(tmp_path, capsys):
    bench = load_bench()
    results = bench.run(scale=1e-5, workdir=tmp_path / "work", hit_processes=0)
    splits = {split for split, _ in results["tables"]}
    assert splits == {"train", "valid", "test"}
    assert len(results["tables"]) == 9
    assert results["build"]["seed"]["samples"] == results["build"]["megaindex"]["samples"]
    assert bench.tables_identical(results)
    rows_file = tmp_path / "rows.jsonl"
    bench.report_results(benchreport.Report("scale", "seed", rows_file), results)
    rows = benchreport.read_rows(rows_file)
    assert [row.unit for row in rows] == ["s", "MiB", "MiB"]
    assert all(row.ours > 0 and row.theirs > 0 and "scale 1e-05" in row.conditions for row in rows)
    printed = capsys.readouterr().out
    assert "DIFFERENT" not in printed and "all tables identical: True" in printed


def test_a_folder_it_did_not_make_is_refused_not_wiped(tmp_path, monkeypatch):
    bench = load_bench()
    kept = tmp_path / "mine.txt"
    kept.write_text("data")
    monkeypatch.setattr(sys, "argv", ["bench_scale.py", "--workdir", str(tmp_path)])
    try:
        bench.main()
    except SystemExit as refused:
        assert "not empty and not made by bench_scale.py" in str(refused)
    else:
        raise AssertionError("bench_scale.py ran in a folder it did not make")
    assert kept.read_text() == "data"

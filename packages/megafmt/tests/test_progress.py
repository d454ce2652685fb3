import io

from megafmt.progress import format_count
from megafmt.shared import Progress


def test_format_count():
    assert format_count(999) == "999"
    assert format_count(1234) == "1.23k"
    assert format_count(2_500_000) == "2.50M"
    assert format_count(0.5) == "0.50"


def test_log_lines_are_throttled_and_the_summary_printed(monkeypatch):
    stream = io.StringIO()
    clock = iter([0.0, 1.0, 2.0, 20.0, 21.0, 21.0, 21.0])
    monkeypatch.setattr("megafmt.progress.time.perf_counter", lambda: next(clock))
    progress = Progress("copy", total=100, unit="bytes", stream=stream, log_interval=10)
    progress.update(10)  # t=1: too soon for a line
    progress.update(10)  # t=2: too soon
    progress.update(30)  # t=20: a line
    progress.close("done")
    lines = stream.getvalue().splitlines()
    assert lines == ["copy: 50/100 (50%) bytes, 2.38 bytes/s, 21.0 s ETA 21 s", "done"]


def test_progress_can_be_silenced(monkeypatch):
    monkeypatch.setenv("MEGA_PROGRESS", "0")
    stream = io.StringIO()
    clock = iter([0.0, 100.0, 100.0])
    monkeypatch.setattr("megafmt.progress.time.perf_counter", lambda: next(clock))
    progress = Progress("copy", stream=stream, log_interval=1)
    progress.update(5)
    progress.close("summary")
    assert stream.getvalue() == "summary\n"


def test_every_prints_a_line_each_multiple_with_the_extra_rates(monkeypatch):
    stream = io.StringIO()
    now = [0.0]
    monkeypatch.setattr("megafmt.progress.time.perf_counter", lambda: now[0])
    progress = Progress("tokenize", unit="docs", stream=stream, also=("MB",), every=100)
    now[0] = 1.0
    progress.update(60, MB=1.0)  # 60 docs: no multiple of 100 passed
    now[0] = 2.0
    progress.update(60, MB=3.0)  # 120 docs passes 100: a line
    now[0] = 4.0
    progress.update(200, MB=4.0)  # 320 passes 200 and 300: one line
    assert stream.getvalue().splitlines() == [
        "tokenize: 120 docs, 60 docs/s, 2 MB/s, 2.0 s",
        "tokenize: 320 docs, 80 docs/s, 2 MB/s, 4.0 s",
    ]

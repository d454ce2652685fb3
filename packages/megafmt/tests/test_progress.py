import io
import os
import sys

import pytest

from megafmt.progress import Progress, format_count


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


class Terminal(io.StringIO):
    """A stream that says it is a terminal."""

    def isatty(self):
        return True


def count_to_ten(stream, monkeypatch, clock_step=1.0):
    """Ten updates of one item, ``clock_step`` seconds apart, then a summary, on ``stream``."""
    now = [0.0]
    monkeypatch.setattr("megafmt.progress.time.perf_counter", lambda: now[0])
    progress = Progress("copy", total=10, unit="items", stream=stream, also=("MB",))
    for _ in range(10):
        now[0] += clock_step
        progress.update(1, MB=2.0)
    progress.close("done")


def test_a_terminal_gets_a_tqdm_bar_then_the_summary(monkeypatch):
    pytest.importorskip("tqdm")
    count_to_ten(stream := Terminal(), monkeypatch)
    shown = stream.getvalue()
    frames = [frame for frame in shown.split("\r") if frame.startswith("copy:")]
    assert len(frames) == 11  # drawn when created, then on each update (0.2 s apart at least)
    assert "100%|" in frames[-1] and "10/10" in frames[-1] and "2 MB/s" in frames[-1]
    assert shown.endswith("\r\x1b[Kdone\n")


def test_a_terminal_without_tqdm_gets_the_line_redrawn_in_place(monkeypatch):
    monkeypatch.setitem(sys.modules, "tqdm", None)  # importing it raises ImportError
    count_to_ten(stream := Terminal(), monkeypatch)
    shown = stream.getvalue()
    frames = shown.split("\r\x1b[K")[1:]
    assert frames[0] == "copy: 1/10 (10%) items, 1 items/s, 2 MB/s, 1.0 s ETA 9 s"
    assert frames[-1] == "done\n" and len(frames) == 11


def test_a_log_never_gets_a_bar_or_control_characters(monkeypatch):
    count_to_ten(stream := io.StringIO(), monkeypatch, clock_step=5.0)
    shown = stream.getvalue()
    assert "\r" not in shown and "\x1b" not in shown and "|" not in shown
    assert shown.splitlines() == [
        "copy: 2/10 (20%) items, 0.20 items/s, 0.40 MB/s, 10.0 s ETA 40 s",
        "copy: 4/10 (40%) items, 0.20 items/s, 0.40 MB/s, 20.0 s ETA 30 s",
        "copy: 6/10 (60%) items, 0.20 items/s, 0.40 MB/s, 30.0 s ETA 20 s",
        "copy: 8/10 (80%) items, 0.20 items/s, 0.40 MB/s, 40.0 s ETA 10 s",
        "copy: 10/10 (100%) items, 0.20 items/s, 0.40 MB/s, 50.0 s",
        "done",
    ]


def test_a_silenced_terminal_gets_only_the_summary(monkeypatch):
    monkeypatch.setenv("MEGA_PROGRESS", "0")
    count_to_ten(stream := Terminal(), monkeypatch)
    assert stream.getvalue() == "\r\x1b[Kdone\n"


def test_a_terminal_of_no_size_gets_the_line_redrawn_in_place(monkeypatch):
    """A pseudo-terminal nobody sized (some CI runners): tqdm would draw nothing there."""
    main, side = os.openpty()  # a new pseudo-terminal reports 0 columns
    with os.fdopen(side, "w", encoding="utf-8") as stream:
        count_to_ten(stream, monkeypatch)
    first = os.read(main, 1 << 16).decode()  # what the terminal got first
    os.close(main)
    assert first.startswith("\r\x1b[Kcopy: 1/10 (10%) items, 1 items/s")

"""A blend's tables drawn on a thread of their own (megaindex.blend_draw): the same tables as
drawn in place, the fill's error raised by the wait, and progress reported while it is long."""

from __future__ import annotations

import threading

import numpy
import pytest

from megaindex import blend_draw
from megaindex.blend_draw import BlendDraw
from megaindex.helpers import build_blending_indices, build_exhaustive_blending_indices


def test_the_drawn_tables_equal_those_drawn_in_place():
    weights, size = [0.5, 0.3, 0.2], 1000
    index, sample_index = numpy.zeros(size, numpy.int16), numpy.zeros(size, numpy.int64)
    build_blending_indices(index, sample_index, weights, 3, size, False)
    drawn = BlendDraw(lambda a, b: build_blending_indices(a, b, weights, 3, size), size, "x")
    numpy.testing.assert_array_equal(drawn.wait()[0], index)
    numpy.testing.assert_array_equal(drawn.wait()[1], sample_index)
    counts = [3, 1, 5]
    build_exhaustive_blending_indices(index[:9], sample_index[:9], counts, 3)
    every = BlendDraw(lambda a, b: build_exhaustive_blending_indices(a, b, counts, 3), 9, "x")
    numpy.testing.assert_array_equal(every.wait()[0], index[:9])
    numpy.testing.assert_array_equal(every.wait()[1], sample_index[:9])


def test_the_fill_s_error_is_raised_by_the_wait():
    def fail(index, sample_index):
        raise ValueError("weights must be finite")

    with pytest.raises(ValueError, match="weights must be finite"):
        BlendDraw(fail, 10, "x").wait()


def test_a_long_draw_reports_the_samples_drawn_and_the_time_left(monkeypatch, capsys):
    monkeypatch.setattr(blend_draw, "PROGRESS_SECONDS", 0.02)
    release = threading.Event()

    class Reported(blend_draw.Progress):
        def update(self, *args, **kwargs):
            super().update(*args, **kwargs)
            release.set()  # the wait reported once: the draw goes on

    monkeypatch.setattr(blend_draw, "Progress", Reported)

    def slow(index, sample_index):  # in sample order, as the extension fills them
        for sample in range(len(index)):
            index[sample] = sample % 3
            if sample == 400:
                release.wait(60)
            elif sample > 400 and sample % 40 == 0:
                threading.Event().wait(0.03)  # longer than a report's interval

    draw = BlendDraw(slow, 1000, "3 datasets")
    for _ in range(1000):  # the draw reaches the held sample, at most 10 s
        if draw.drawn() == 401:
            break
        threading.Event().wait(0.01)
    assert draw.drawn() == 401  # counted by bisection of the filled prefix
    index, _ = draw.wait()
    assert (index >= 0).all()
    err = capsys.readouterr().err
    assert "blending indices of 3 datasets: the 599 samples after the first 401" in err
    assert "ETA" in err  # a line with the estimate, while the draw went on
    assert "599/599 (100%)" in err  # the summary: the samples drawn since the wait began


def test_a_short_draw_says_nothing(capsys):
    draw = BlendDraw(lambda index, sample_index: index.fill(0), 10, "2 datasets")
    draw.wait()
    assert capsys.readouterr().err == ""

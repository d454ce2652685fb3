"""Progress lines for long work (merges, verification of large corpora, index builds).

On a terminal, with tqdm installed (``pip install megafmt[progress]``; the tokenizer libraries'
hub clients bring it too), a tqdm bar shows the count, percentage, rate and ETA, sized to the
terminal and kept apart from other output written through tqdm; without tqdm the same figures
are one line redrawn in place a few times a second. Elsewhere (CI logs, files) a plain line is
printed every ``log_interval`` seconds so logs stay short and free of control characters; tqdm
is never used there. ``close`` prints a summary. Set ``MEGA_PROGRESS=0`` to silence progress
lines (summaries still print). The description and a given summary pass through
:func:`~megafmt.redaction.redact` once, where they come in: one that quotes a signed or
credentialed URL shows no secret, and the lines redrawn from them need no redaction each.
"""

from __future__ import annotations

import os
import sys
import time
from types import TracebackType
from typing import Any, TextIO

from megafmt.redaction import redact

BYTE_UNITS = ("B", "bytes")  # counts tqdm shows scaled (1.23MB); other units as integers


def format_count(value: float) -> str:
    """``1234567`` as ``1.23M``: short, for rates and sizes in progress lines."""
    for threshold, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= threshold:
            return f"{value / threshold:.2f}{suffix}"
    return f"{value:.0f}" if float(value).is_integer() else f"{value:.2f}"


def _zero_width(stream: TextIO) -> bool:
    """Whether ``stream`` is a terminal that reports no size (a pseudo-terminal nobody sized,
    as some CI runners and ``script`` make): tqdm would draw nothing there."""
    try:
        return os.get_terminal_size(stream.fileno()).columns == 0
    except (AttributeError, OSError, ValueError):  # no descriptor, or not a terminal's
        return False


def _terminal_bar(description: str, total: float | None, unit: str, stream: TextIO) -> Any:
    """A tqdm bar drawing on ``stream``, or None when tqdm is not installed (or could not draw
    on this terminal)."""
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    if _zero_width(stream):
        return None
    return tqdm(
        desc=description,
        total=total,
        unit=unit,
        unit_scale=unit in BYTE_UNITS,
        file=stream,
        dynamic_ncols=True,
        leave=False,
        mininterval=float("inf"),
    )


class Progress:
    """Counts work done toward an optional ``total`` and reports it on ``stream``."""

    def __init__(
        self,
        description: str,
        total: float | None = None,
        unit: str = "items",
        stream: TextIO | None = None,
        log_interval: float = 10.0,
        also: tuple[str, ...] = (),
        every: float | None = None,
        started: float | None = None,
    ) -> None:
        """``started``: the :func:`time.perf_counter` at which the work began, where the
        progress is made after it (a line drawn only once the work runs long); its rates and
        estimates count from there. None: now."""
        self.description = redact(description)  # may quote a signed URL
        self.total = total
        self.unit = unit
        self.done = 0.0
        self.also = dict.fromkeys(also, 0.0)
        self._every = every
        self._stream = stream if stream is not None else sys.stderr
        self._tty = bool(getattr(self._stream, "isatty", lambda: False)())
        self._enabled = os.environ.get("MEGA_PROGRESS", "1") != "0"
        self._interval = 0.2 if self._tty else log_interval
        self._bar = (
            _terminal_bar(self.description, total, unit, self._stream)
            if self._tty and self._enabled
            else None
        )
        self._start = time.perf_counter() if started is None else started
        self._last = self._start

    @property
    def elapsed(self) -> float:
        """Seconds since the progress began."""
        return time.perf_counter() - self._start

    def update(self, amount: float = 1, **also: float) -> None:
        """Record ``amount`` more units of work (and of the ``also`` units), redrawing the line
        when it is due: after ``log_interval`` seconds, or off a terminal with ``every``, each
        time the count passes a multiple of ``every``."""
        before = self.done
        self.done += amount
        for unit, value in also.items():
            self.also[unit] += value
        now = time.perf_counter()
        if self._every is not None and not self._tty:
            due = self.done // self._every > before // self._every
        else:
            due = now - self._last >= self._interval
        if self._bar is not None:
            self._bar.update(amount)
            if due:  # redrawn on this class's schedule (the bar's own never fires)
                self._last = now
                if self.also:
                    rates = self._rates(self.elapsed)[1:]
                    self._bar.set_postfix_str(", ".join(rates), refresh=False)
                self._bar.refresh()
        elif self._enabled and due:
            self._last = now
            self._write(self._line(), final=False)

    def _rates(self, elapsed: float) -> list[str]:
        """The rate of the main unit, then of each ``also`` unit, over ``elapsed`` seconds."""
        counts = {self.unit: self.done, **self.also}
        return [
            f"{format_count(value / elapsed if elapsed > 0 else 0.0)} {unit}/s"
            for unit, value in counts.items()
        ]

    def _line(self) -> str:
        elapsed = self.elapsed
        rate = self.done / elapsed if elapsed > 0 else 0.0
        parts = [f"{self.description}: {format_count(self.done)}"]
        if self.total:
            parts[0] += f"/{format_count(self.total)}"
            parts.append(f"({100 * self.done / self.total:.0f}%)")
        parts.append(f"{self.unit}, {', '.join(self._rates(elapsed))}, {elapsed:.1f} s")
        if self.total and rate > 0 and self.done < self.total:
            parts.append(f"ETA {(self.total - self.done) / rate:.0f} s")
        return " ".join(parts)

    def _write(self, line: str, final: bool) -> None:
        if self._tty:
            self._stream.write("\r\x1b[K" + line + ("\n" if final else ""))
        else:
            self._stream.write(line + "\n")
        self._stream.flush()

    def close(self, summary: str | None = None) -> None:
        """Finish with ``summary``, or the final count and rate; ``""`` just clears the line."""
        summary = self._line() if summary is None else redact(summary)
        if self._bar is not None:
            self._bar.close()  # leave=False: the bar's line is cleared
            self._bar = None
        if summary:
            self._write(summary, final=True)
        elif self._tty:
            self._stream.write("\r\x1b[K")

    def __enter__(self) -> Progress:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.close()
        elif self._bar is not None:
            self._bar.close()
            self._bar = None
        elif self._tty:
            self._stream.write("\n")

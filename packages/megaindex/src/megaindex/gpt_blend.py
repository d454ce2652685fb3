"""A blend of GPT datasets read whole: GPT's own way of merging its parts' rows.

When every part of a blend is a GPT dataset that assembles batches, with one sample
configuration, the parts' rows need not become samples part by part: every row's window is
read into one array (in one native call, :class:`megaindex.helpers.BlendGatherer`, when every
part gathers from a mapped ``.bin``; else each part fills its own rows) and the first part's
sample maker turns the whole array into the batch in one pass. It uses only the public members
of :class:`~megaindex.gpt_dataset.GPTDataset` (``window_length``, ``sample_maker``, ``windows``,
``read_windows``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy

from megaindex import helpers
from megaindex.windows import MappedWindowReader, can_hold, pad_rows


class GPTBlendGatherer:
    """Reads the batches of the blend of GPT datasets ``parts`` whose tables are
    ``dataset_index`` and ``dataset_sample_index`` (implements
    :class:`megaindex.batch_merge.BlendGatherer`)."""

    def __init__(
        self,
        parts: Sequence[Any],
        dataset_index: numpy.ndarray,
        dataset_sample_index: numpy.ndarray,
    ) -> None:
        self.parts = list(parts)
        self.dataset_index = dataset_index
        self.dataset_sample_index = dataset_sample_index
        self.maker = self.parts[0].sample_maker
        self.width = self.parts[0].window_length
        self._mapped = all(
            isinstance(part.windows, MappedWindowReader) and not part.shapes_samples
            for part in self.parts
        )
        self._native: helpers.BlendGatherer | None = None
        self._parts_hold_pad = True

    def native(self) -> helpers.BlendGatherer | None:
        """The native gatherer over every part's mapped ``.bin`` (made on first use); None
        unless every part gathers from one."""
        if self._native is None and self._mapped:
            gatherers = [part.windows.gatherer() for part in self.parts]
            if any(gatherer is None for gatherer in gatherers):
                return None
            self._native = helpers.BlendGatherer(
                gatherers, self.dataset_index, self.dataset_sample_index
            )
            self._parts_hold_pad = any(
                can_hold(part.windows.source.tokens_view.dtype, self.maker.pad)
                for part in self.parts
            )
        return self._native

    def gather(self, positions: list[int], padding: list[bool]) -> dict[str, Any]:
        """The collated batch of blend samples ``positions`` (``padding``: rows with no loss)."""
        texts = numpy.empty((len(positions), self.width), dtype=numpy.int64)
        native = self.native()
        if native is not None:
            padded = pad_rows(native.gather(positions, texts), texts, self.maker.pad)
            may_hold_pad = padded or self._parts_hold_pad
        else:  # some part reads spans, or shapes its samples: each reads its own rows
            may_hold_pad = False
            ids = self.dataset_index[positions]
            samples = self.dataset_sample_index[positions]
            for dataset_id in numpy.unique(ids).tolist():
                rows = numpy.flatnonzero(ids == dataset_id)
                part = numpy.empty((len(rows), self.width), dtype=numpy.int64)
                may_hold_pad |= self.parts[dataset_id].read_windows(samples[rows].tolist(), part)
                texts[rows] = part
        return self.maker.batch(texts, padding, may_hold_pad)

    def __getstate__(self) -> dict[str, Any]:
        # the native gatherer is state of this process: a worker makes its own
        return {**self.__dict__, "_native": None}

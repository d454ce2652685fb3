"""Fill-in-the-middle: a sample's tokens rearranged into prefix-suffix-middle (PSM) or
suffix-prefix-middle (SPM) form, draw for draw as Megatron-LM's ``GPTFIMDataset`` does it.

What happens to a sample (its window of ``sequence_length`` + extra tokens), and the order of
the random draws, which decides every later sample:

1. The sample is cut at each FIM end-of-document token into segments. A non-empty segment is
   rearranged and keeps its EOD after it; an empty one (an EOD first, or two in a row) is
   dropped together with its EOD. The part after the last EOD is always rearranged, even empty.
2. Without ``fim_split_sample``, or without that token in it, a segment is one piece at
   ``fim_rate``. With the token in it, one draw at ``fim_rate`` decides whether the segment is
   touched at all; if so it is cut at the split token as in step 1 (empty fragments dropped
   with their split token) and each fragment is a piece at ``fim_fragment_rate``.
3. A piece: a draw at its rate decides whether it is rearranged. If it is, its text (decoded
   with special tokens removed) is left alone when it starts with ``fim_no_prefix`` (no further
   draw); otherwise two character positions drawn in ``0..len(text)`` and sorted cut it into
   prefix, middle and suffix, each encoded again, and a draw at ``fim_spm_rate`` chooses
   SPM ``<prefix> <suffix> suffix <middle> prefix middle`` over
   PSM ``<prefix> prefix <suffix> suffix <middle> middle``.
4. The result is cut to the sample's length, or filled up with the FIM pad token.

The draws come from a ``numpy.random.RandomState`` the caller owns, so the stream is numpy's
own, bit for bit. The walk (steps 1-3) runs here and records the rearranged sample as runs of
tokens, taken from the sample or from the inserted sentinels and re-encoded parts; laying the
runs out (step 4) is one call of :func:`megaindex.helpers.fim_assemble` (C++, or its numpy
mirror).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy

from megafmt.protocols import TextTokenizer
from megaindex.errors import ConfigError
from megaindex.helpers import fim_assemble


@dataclass(frozen=True)
class FIMTokens:
    """The ids of the sentinel tokens, and of the token samples are split at (None: unset)."""

    prefix: int
    middle: int
    suffix: int
    pad: int
    eod: int
    split: int | None = None


@dataclass(frozen=True)
class FIMRates:
    """How often pieces are rearranged, and in which form."""

    rate: float
    """A piece (a segment, or a segment holding the split token) is rearranged."""
    spm_rate: float
    """A rearranged piece takes SPM form rather than PSM."""
    fragment_rate: float | None = None
    """A fragment of a segment cut at the split token is rearranged (None: reaching a
    fragment is an error, as it is in Megatron-LM)."""
    no_prefix: str | None = None
    """Pieces whose text starts with this are left as they are."""


class _Runs:
    """A rearranged sample as runs of tokens: ``(0, start, stop)`` of the sample, ``(1, start,
    stop)`` of ``inserted``. Adjacent runs of one source are merged as they are added."""

    def __init__(self) -> None:
        self.runs: list[list[int]] = []
        self.inserted: list[int] = []

    def _add(self, source: int, start: int, stop: int) -> None:
        last = self.runs[-1] if self.runs else None
        if last is not None and last[0] == source and last[2] == start:
            last[2] = stop
        else:
            self.runs.append([source, start, stop])

    def keep(self, start: int, stop: int) -> None:
        self._add(0, start, stop)

    def insert(self, ids: list[int]) -> None:
        start = len(self.inserted)
        self.inserted.extend(ids)
        self._add(1, start, len(self.inserted))


class FIMRearranger:
    """Rearranges samples with one tokenizer, set of sentinel ids and rates."""

    def __init__(self, tokenizer: TextTokenizer, tokens: FIMTokens, rates: FIMRates) -> None:
        self.tokenizer = tokenizer
        self.tokens = tokens
        self.rates = rates

    def rearrange(self, rng: numpy.random.RandomState, sample: numpy.ndarray) -> numpy.ndarray:
        """``sample`` (int64) rearranged, same length; ``sample`` itself when nothing moved."""
        runs = self.runs(rng, sample)
        if not runs.inserted and runs.runs == [[0, 0, len(sample)]]:
            return sample
        out = numpy.empty_like(sample)
        fim_assemble(
            sample,
            numpy.array(runs.inserted, dtype=numpy.int64),
            numpy.array(runs.runs, dtype=numpy.int64).reshape(-1, 3),
            out,
            self.tokens.pad,
        )
        return out

    def runs(self, rng: numpy.random.RandomState, sample: numpy.ndarray) -> _Runs:
        """The walk of steps 1-3 over ``sample``, drawing from ``rng``."""
        runs = _Runs()
        start = 0
        for end in numpy.flatnonzero(sample == self.tokens.eod).tolist():
            if end > start:
                self._segment(rng, sample, start, end, runs)
                runs.keep(end, end + 1)
            start = end + 1
        self._segment(rng, sample, start, len(sample), runs)
        return runs

    def _segment(
        self,
        rng: numpy.random.RandomState,
        sample: numpy.ndarray,
        start: int,
        stop: int,
        runs: _Runs,
    ) -> None:
        split = self.tokens.split
        breaks = [] if split is None else numpy.flatnonzero(sample[start:stop] == split).tolist()
        if not breaks:
            self._piece(rng, sample, start, stop, self.rates.rate, runs)
            return
        if not rng.binomial(1, self.rates.rate):
            runs.keep(start, stop)
            return
        if self.rates.fragment_rate is None:
            raise ConfigError(
                "GPTFIMDatasetConfig.fim_fragment_rate is None, but a segment holding the "
                f"fim_split_sample token (id {split}) was drawn to be rearranged fragment by "
                "fragment, which needs a probability in [0, 1]: set fim_fragment_rate "
                "(--fim-fragment-rate); the seed commit fails here too"
            )
        offset = start
        for end in breaks:
            end += offset
            if end > start:
                self._piece(rng, sample, start, end, self.rates.fragment_rate, runs)
                runs.keep(end, end + 1)
            start = end + 1
        self._piece(rng, sample, start, stop, self.rates.fragment_rate, runs)

    def _piece(
        self,
        rng: numpy.random.RandomState,
        sample: numpy.ndarray,
        start: int,
        stop: int,
        rate: float | None,
        runs: _Runs,
    ) -> None:
        if not rng.binomial(1, rate):
            runs.keep(start, stop)
            return
        text = self.tokenizer.ids_to_text(sample[start:stop], remove_special_tokens=True)
        no_prefix = self.rates.no_prefix
        if no_prefix is not None and text.startswith(no_prefix):
            runs.keep(start, stop)
            return
        first, second = sorted(rng.randint(low=0, high=len(text) + 1, size=2).tolist())
        encode = self.tokenizer.text_to_ids
        prefix, middle, suffix = (
            encode(text[:first]),
            encode(text[first:second]),
            encode(text[second:]),
        )
        tokens = self.tokens
        if rng.binomial(1, self.rates.spm_rate):
            runs.insert([tokens.prefix, tokens.suffix, *suffix, tokens.middle, *prefix, *middle])
        else:
            runs.insert([tokens.prefix, *prefix, tokens.suffix, *suffix, tokens.middle, *middle])

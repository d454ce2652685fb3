"""Pure-numpy builders with the same inputs, outputs and IndexError messages as the C++ extension
``megaindex._ext``; arguments are checked before either is called (:mod:`megaindex.helpers`).

Used when the extension is not built (or ``MEGAINDEX_BACKEND=numpy``). The sample index is
computed in closed form: sample k starts ``k * sequence_length`` tokens into the stream, in the
first document whose end reaches past that start plus the extra token. The blending builders
are sequential by nature and run as Python loops.
"""

from __future__ import annotations

import math

import numpy


def sample_count(
    num_epochs: int,
    tokens_per_epoch: int,
    sequence_length: int,
    drop_last_partial_sequence: bool,
    add_extra_token: int,
) -> int:
    usable = num_epochs * tokens_per_epoch - add_extra_token
    if drop_last_partial_sequence:  # C's division, truncating toward 0 (-1 tokens: 0 samples)
        return usable // sequence_length if usable >= 0 else -(-usable // sequence_length)
    # single precision on purpose, as the reference computes it
    return math.ceil(numpy.float32(usable) / numpy.float32(sequence_length))


def _sample_index(
    sizes: numpy.ndarray,
    document_index: numpy.ndarray,
    sequence_length: int,
    num_samples: int,
    add_extra_token: int,
    dtype: type,
) -> numpy.ndarray:
    lengths = sizes[document_index].astype(numpy.int64)
    ends = numpy.cumsum(lengths)
    starts = numpy.arange(1, num_samples + 1, dtype=numpy.int64) * sequence_length
    position = numpy.searchsorted(ends, starts + add_extra_token, side="left")
    past_the_end = position >= len(lengths)
    position[past_the_end] = len(lengths) - 1
    offset = starts - (ends[position] - lengths[position])
    offset[past_the_end] = lengths[-1] - add_extra_token
    out = numpy.zeros((num_samples + 1, 2), dtype=dtype)
    out[1:, 0] = position
    out[1:, 1] = offset
    return out


def _checked_document_index(
    sizes: numpy.ndarray, document_index: numpy.ndarray, first: int = 0
) -> None:
    """Raise the walk's IndexError for an id outside ``sizes`` (``document_index`` starting at
    position ``first`` of the whole)."""
    outside = numpy.flatnonzero((document_index < 0) | (document_index >= len(sizes)))
    if len(outside):
        position = int(outside[0])
        raise IndexError(
            f"document_index[{first + position}] = {document_index[position]} is not a "
            f"document id: expected 0..{len(sizes) - 1}"
        )


def fill_sample_index(
    sizes, document_index, sequence_length, add_extra_token, out, first_row, last_row
) -> None:
    """Rows [first_row, last_row) of ``out``, the walk resumed from row first_row - 1: the
    documents from there on are read in windows doubled until they hold every row's tokens."""
    if len(document_index) == 0:
        raise ValueError("document_index is empty")
    if first_row == 0 and last_row > 0:
        out[0] = 0
        first_row = 1
    rows = last_row - first_row
    if rows <= 0:
        return
    position, offset = (int(value) for value in out[first_row - 1])
    if not 0 <= position < len(document_index):
        raise IndexError(
            f"out[{first_row - 1}] holds position {position}, outside document_index's "
            f"{len(document_index)} entries"
        )
    # tokens from the start of document `position` to where the last row's sample ends
    needed = offset + rows * sequence_length + add_extra_token
    end = position + rows
    while True:
        end = min(end, len(document_index))
        window = document_index[position:end]
        _checked_document_index(sizes, window, position)
        lengths = sizes[window].astype(numpy.int64)
        ends = numpy.cumsum(lengths)
        if ends[-1] >= needed or end == len(document_index):
            break
        end = position + 2 * (end - position)
    starts = offset + numpy.arange(1, rows + 1, dtype=numpy.int64) * sequence_length
    found = numpy.searchsorted(ends, starts + add_extra_token, side="left")
    past_the_end = found >= len(lengths)
    found[past_the_end] = len(lengths) - 1
    within = starts - (ends[found] - lengths[found])
    within[past_the_end] = lengths[-1] - add_extra_token
    out[first_row:last_row, 0] = found + position
    out[first_row:last_row, 1] = within


def build_sample_index_int32(sizes, document_index, sequence_length, num_samples, add_extra_token):
    _checked_document_index(sizes, document_index)
    return _sample_index(
        sizes, document_index, sequence_length, num_samples, add_extra_token, numpy.int32
    )


def build_sample_index_int64(sizes, document_index, sequence_length, num_samples, add_extra_token):
    _checked_document_index(sizes, document_index)
    return _sample_index(
        sizes, document_index, sequence_length, num_samples, add_extra_token, numpy.int64
    )


def build_gpt_tables(
    sizes,
    documents,
    num_epochs,
    separate_final_epoch,
    seed,
    sequence_length,
    add_extra_token,
    num_samples,
    samples_first,
    int64_sample_index,
    int64_shuffle_index,
):
    random_state = numpy.random.RandomState(seed)
    document_index = numpy.tile(documents, num_epochs)
    last = len(documents) if separate_final_epoch and num_epochs > 1 else len(document_index)
    for part in (document_index[: len(document_index) - last], document_index[-last:]):
        random_state.shuffle(part)
    build = build_sample_index_int64 if int64_sample_index else build_sample_index_int32
    sample_index = build(sizes, document_index, sequence_length, num_samples, add_extra_token)
    dtype = numpy.int64 if int64_shuffle_index else numpy.uint32
    shuffle_index = numpy.arange(num_samples, dtype=dtype)
    for part in (shuffle_index[:samples_first], shuffle_index[samples_first:]):
        random_state.shuffle(part)
    return document_index, sample_index, shuffle_index


def build_blending_indices(weights, dataset_index, dataset_sample_index) -> None:
    weights = [float(w) for w in weights]
    taken = [0] * len(weights)
    datasets = range(len(weights))
    for sample in range(len(dataset_index)):
        progress = max(float(sample), 1.0)
        chosen = max(datasets, key=lambda d: (weights[d] * progress - taken[d], -d))
        dataset_index[sample] = chosen
        dataset_sample_index[sample] = taken[chosen]
        taken[chosen] += 1


def build_exhaustive_blending_indices(sizes, dataset_index, dataset_sample_index) -> None:
    sizes = [int(s) for s in sizes]
    total = sum(sizes)
    weights = [s / total for s in sizes]
    taken = [0] * len(sizes)
    still_open = list(range(len(sizes)))
    sample = 0
    while still_open:
        progress = max(float(sample), 1.0)
        chosen = max(still_open, key=lambda d: (weights[d] * progress - taken[d], -d))
        dataset_index[sample] = chosen
        dataset_sample_index[sample] = taken[chosen]
        taken[chosen] += 1
        if taken[chosen] == sizes[chosen]:
            still_open.remove(chosen)
        sample += 1


def legacy_shuffle(key: numpy.ndarray, pos: int, data: numpy.ndarray) -> int:
    """RandomState.shuffle on the state (key, pos), updating key in place; returns the new pos."""
    random_state = numpy.random.RandomState()
    random_state.set_state(("MT19937", key, pos))
    random_state.shuffle(data)
    _, new_key, new_pos, _, _ = random_state.get_state()
    key[:] = new_key
    return int(new_pos)


def fill_document_causal_mask(
    segment_start: numpy.ndarray, out: numpy.ndarray, threads: int
) -> None:
    rows = numpy.arange(len(segment_start))
    outside = numpy.flatnonzero((segment_start < 0) | (segment_start > rows))
    if len(outside):
        row = int(outside[0])
        raise IndexError(f"segment_start[{row}] = {int(segment_start[row])} is outside 0..{row}")
    numpy.logical_or(rows[None, :] < segment_start[:, None], rows[None, :] > rows[:, None], out=out)


def fim_assemble(sample, inserted, runs, out, pad) -> int:
    sources = (sample, inserted)
    for run, (source, start, stop) in enumerate(runs.tolist()):
        if source not in (0, 1) or start < 0 or stop < start or stop > len(sources[source]):
            raise IndexError(
                f"run {run} = ({source}, {start}, {stop}): expected source 0 (sample, "
                f"{len(sample)} tokens) or 1 (inserted, {len(inserted)} tokens) and "
                "0 <= start <= stop <= its size"
            )
    pieces = [sources[source][start:stop] for source, start, stop in runs.tolist()]
    laid_out = numpy.concatenate(pieces) if pieces else sample[:0]
    written = min(len(laid_out), len(out))
    out[:written] = laid_out[:written]
    out[written:] = pad
    return len(laid_out)


class WindowGatherer:
    """The windows of one corpus and one split's tables, one document at a time, with the checks
    and messages of the C++ kernel (csrc/gather.hpp) in the same order."""

    def __init__(
        self,
        tokens: numpy.ndarray,
        pointers: numpy.ndarray,
        lengths: numpy.ndarray,
        document_index: numpy.ndarray,
        sample_index: numpy.ndarray,
        shuffle_index: numpy.ndarray,
        extra: int,
    ) -> None:
        self.tables = (tokens, pointers, lengths, document_index, sample_index, shuffle_index)
        self.extra = extra

    def gather(self, samples: list[int], out: numpy.ndarray) -> list[int]:
        """The tokens of each sample of ``samples`` into its row of ``out``; the counts."""
        tokens, pointers, lengths, document_index, sample_index, shuffle_index = self.tables
        extra = self.extra
        written = [0] * len(samples)
        itemsize = tokens.itemsize
        width = out.shape[1]
        for row, sample in enumerate(samples):
            if not 0 <= sample < len(shuffle_index):
                raise IndexError(
                    f"sample {sample}: outside shuffle_index's {len(shuffle_index)} entries"
                )
            shuffled = int(shuffle_index[sample])
            if not 0 <= shuffled < len(sample_index) - 1:
                raise IndexError(
                    f"sample {sample}: shuffle_index[{sample}] = {shuffled} needs rows outside "
                    f"sample_index's {len(sample_index)}"
                )
            (begin, begin_offset), (end, end_offset) = sample_index[
                shuffled : shuffled + 2
            ].tolist()
            if begin < 0 or end < begin or end >= len(document_index):
                raise IndexError(
                    f"sample {sample}: spans document_index[{begin}..{end}], outside its "
                    f"{len(document_index)} entries"
                )
            count = 0
            for position in range(begin, end + 1):
                document = int(document_index[position])
                if not 0 <= document < len(lengths):
                    raise IndexError(
                        f"sample {sample}: document {document} at document_index[{position}] "
                        f"is not one of the {len(lengths)} sequences"
                    )
                size = int(lengths[document])
                pointer = int(pointers[document])
                if pointer < 0 or pointer % itemsize:
                    raise IndexError(
                        f"sample {sample}: document {document} starts at byte {pointer}, not a "
                        "token boundary of the .bin"
                    )
                base = pointer // itemsize
                if base > len(tokens):
                    raise IndexError(
                        f"sample {sample}: document {document} starts at byte {pointer}, past "
                        f"the end of the .bin ({len(tokens) * itemsize} bytes)"
                    )
                first = begin_offset if position == begin else 0
                last = end_offset + extra if position == end else size
                if first < 0 or last < first or last > size:
                    raise IndexError(
                        f"sample {sample}: tokens [{first}, {last}) are outside document "
                        f"{document}, which has {size}"
                    )
                if last > len(tokens) - base:
                    raise IndexError(
                        f"sample {sample}: document {document} needs tokens up to {last} from "
                        f"token {base}, past the end of the .bin ({len(tokens)} tokens)"
                    )
                span = last - first
                if span > width - count:
                    raise IndexError(
                        f"sample {sample}: needs room for more than the {width} tokens of a row "
                        "of out"
                    )
                out[row, count : count + span] = tokens[base + first : base + last]
                count += span
            written[row] = count
        return written


class BlendGatherer:
    """A blend's windows through its parts' gatherers, with the C++ kernel's messages."""

    def __init__(
        self,
        parts: list[WindowGatherer],
        dataset_index: numpy.ndarray,
        dataset_sample_index: numpy.ndarray,
    ) -> None:
        self.parts = tuple(parts)
        self.dataset_index = dataset_index
        self.dataset_sample_index = dataset_sample_index

    def gather(self, indices: list[int], out: numpy.ndarray) -> list[int]:
        written = []
        for row, index in enumerate(indices):
            if not 0 <= index < len(self.dataset_index):
                raise IndexError(
                    f"blend sample {index}: outside its {len(self.dataset_index)} samples"
                )
            part = int(self.dataset_index[index])
            if not 0 <= part < len(self.parts):
                raise IndexError(
                    f"blend sample {index}: dataset_index holds {part}, not one of the "
                    f"{len(self.parts)} datasets"
                )
            sample = int(self.dataset_sample_index[index])
            try:
                written += self.parts[part].gather([sample], out[row : row + 1])
            except IndexError as error:
                raise IndexError(f"blend sample {index} (dataset {part}): {error}") from None
        return written

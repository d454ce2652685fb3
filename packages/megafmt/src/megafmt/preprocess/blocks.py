"""The block path: a chunk of jsonl lines parsed in one call and encoded in one call.

Where it applies (no ``--split-sentences``, a tokenizer whose chosen library takes a block of
texts in one buffer, pyarrow installed), each chunk's lines are parsed by pyarrow's JSON reader
into one UTF-8 buffer per json key, that buffer is encoded by one call that gives one flat array
of ids and a count per text, and the documents are assembled from those two arrays: no Python
object per line or per token.

The line path (Python's ``json.loads`` of each line, the rules of Megatron's tool) stays the
definition. A chunk where the block path could read anything differently goes to the line path
whole, which then finds and names its bad lines as before: bytes that are not UTF-8, a line
that pyarrow takes and Python refuses (a bare ``Inf`` or ``-NaN`` value, a leading byte-order
mark, a NUL byte, which pyarrow's parser takes for the end of its input, an integer of more
digits than the interpreter converts), a line that is not one
object from its first byte to its last (blank, or part of an object over several lines: pyarrow
reads the block as one stream, so such a line and a line of two objects could give as many rows
as lines), a line pyarrow refuses, a key missing or not a string (a list of sentences, say), ids
that do not fit the output dtype, an encoder that raises.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import numpy

from megafmt.preprocess.encoded import EncodedKey, sequence_lengths
from megafmt.preprocess.inputs import Chunk
from megafmt.tokenizers.base import BlockTokenizer, FlatEncoder
from megafmt.tokenizers.fast_backend import GIGATOKEN

#: what pyarrow reads in a line that Python's json refuses: a bare Inf or -Inf value (not
#: Infinity), -NaN, a line that starts with a UTF-8 byte-order mark. A line holding one where a
#: value could start (:data:`VALUE_OPENERS`; the mark anywhere) is checked by json.loads itself.
SUSPECTS = (b"Inf", b"NaN", b"\xef\xbb\xbf")
#: what precedes a bare value, JSON whitespace aside: an Inf or NaN after anything else (a
#: letter, a quote: "Information") is inside a string, or is refused by pyarrow too
VALUE_OPENERS = b":,[-+"
#: how much whitespace before an Inf or NaN is looked past for an opener; a longer run leaves
#: the line in doubt
WHITESPACE_LOOKED_PAST = 16
#: a line with fewer opening brackets than this cannot be nested too deep for Python's json
#: (which recursion stops near 1,000 levels); one with more is checked by json.loads itself
DEEP_ENOUGH = 256
#: the whitespace Python's json skips around a value
JSON_WHITESPACE = b" \t\r\n"
#: what may follow a suspect Inf without making it a suspect
INFINITY_TAIL = b"inity"
#: the bytes of a line's end, an object's brackets and a list's opening one
NEWLINE, OPEN, CLOSE, OPEN_LIST = b"\n{}["


def block_path_note(tokenizer_backend: str, split_sentences: bool) -> str:
    """How a run reads its jsonl, in one line for the log: by blocks, or line by line and why.
    ``tokenizer_backend``: the library the tokenizer's self-check chose."""
    why = _why_not(tokenizer_backend == GIGATOKEN, split_sentences)
    if why is None:
        return "jsonl read by blocks (a chunk parsed by pyarrow, encoded by one gigatoken call)"
    return f"jsonl read line by line: {why}"


def _why_not(encodes_blocks: bool, split_sentences: bool) -> str | None:
    if split_sentences:
        return "--split-sentences splits each text on its own"
    if not encodes_blocks:
        return "the tokenizer's library encodes text by text (gigatoken encodes blocks)"
    try:
        import pyarrow.json  # noqa: F401
    except ImportError:
        return "pyarrow is not installed (pip install megafmt[huggingface])"
    return None


class BlockEncoder:
    """Parses and encodes whole chunks of jsonl lines; ``encode`` gives None for a chunk the
    line path has to take."""

    def __init__(
        self,
        encoder: FlatEncoder,
        json_keys: tuple[str, ...],
        eod: int | None,
        parallel: bool | None = None,
    ) -> None:
        """``parallel``: as ``encoder.encode_flat`` takes it. awkward and pyarrow are imported
        here: a run's main process builds this before its workers fork, and they inherit both
        (a fifth of a second of imports per worker otherwise)."""
        import awkward
        import pyarrow
        import pyarrow.json

        self._encoder = encoder
        self._keys = json_keys
        self._eod = eod
        self._parallel = parallel
        self._awkward = awkward
        self._pyarrow = pyarrow
        self._parse_options = pyarrow.json.ParseOptions(
            explicit_schema=pyarrow.schema([(key, pyarrow.string()) for key in json_keys]),
            unexpected_field_behavior="ignore",
        )

    @classmethod
    def for_tokenizer(
        cls,
        tokenizer: object,
        split_sentences: bool,
        json_keys: tuple[str, ...],
        eod: int | None,
        parallel: bool | None = None,
    ) -> BlockEncoder | None:
        """The block encoder of a run with ``tokenizer``, or None where the run reads line by
        line (:func:`block_path_note` says why)."""
        encoder = tokenizer.flat_encoder() if isinstance(tokenizer, BlockTokenizer) else None
        if _why_not(encoder is not None, split_sentences) is not None:
            return None
        return cls(encoder, json_keys, eod, parallel)  # type: ignore[arg-type]

    def encode(self, chunk: Chunk) -> dict[str, EncodedKey] | None:
        """Each json key's documents of ``chunk``, one per line, or None where the line path
        has to read it."""
        if not isinstance(chunk.data, bytes) or not chunk.data:
            return None  # rows already read (parquet)
        columns = self._parse(chunk.data, chunk.count)
        if columns is None:
            return None
        documents = {}
        for key, (data, offsets) in columns.items():
            try:
                texts = _strings(self._awkward, data, offsets)
                flat, counts = self._encoder.encode_flat(texts, self._parallel)
            except Exception:  # the line path finds the document and says why, or raises
                return None
            documents[key] = self._assemble(flat, counts)
        return documents

    def _parse(self, block: bytes, lines: int) -> dict[str, tuple[Any, Any]] | None:
        """Each key's texts as (UTF-8 bytes, int64 offsets), where pyarrow reads ``block``
        (of ``lines`` lines) exactly as Python's json reads each of its lines."""
        try:
            block.decode("utf-8")
        except UnicodeDecodeError:
            return None
        if b"\x00" in block or not _screened(block):
            return None
        pyarrow = self._pyarrow
        options = pyarrow.json.ReadOptions(use_threads=False, block_size=len(block) + 1)
        try:
            table = pyarrow.json.read_json(
                pyarrow.py_buffer(block), read_options=options, parse_options=self._parse_options
            )
        except pyarrow.ArrowException:  # ArrowInvalid for a line it refuses; any other too
            return None
        if table.num_rows != lines:  # two objects on a line: every line gives one row or more
            return None
        columns = {}
        for key in self._keys:
            column = table.column(key).combine_chunks()
            if column.null_count:
                return None
            _, offsets, data = column.buffers()
            first = column.offset
            offsets = numpy.frombuffer(offsets, numpy.int32, len(column) + 1, first * 4)
            data = (
                numpy.frombuffer(data, numpy.uint8)
                if data is not None
                else numpy.empty(0, numpy.uint8)
            )
            columns[key] = (data[offsets[0] : offsets[-1]], (offsets - offsets[0]).astype("i8"))
        return columns

    def _assemble(self, flat: numpy.ndarray, counts: numpy.ndarray) -> EncodedKey:
        """One document per text: the texts with ids are its sequences (the EOD after each);
        an empty one is a document without sequences."""
        has_tokens = counts > 0
        lengths = counts[has_tokens]
        tokens = flat
        if self._eod is not None:
            tokens = numpy.insert(flat, numpy.cumsum(counts)[has_tokens], self._eod)
            lengths = lengths + 1
        return EncodedKey(tokens, sequence_lengths(lengths), has_tokens.astype(numpy.int64))


def _screened(block: bytes) -> bool:
    """Whether pyarrow reads every line of ``block`` as Python's json reads it, as far as the
    bytes tell: each line one object wide (:func:`_one_object_wide`), and Python's json takes
    each line that holds a suspect (:data:`SUSPECTS`) or enough brackets to be nested too deep
    (:data:`DEEP_ENOUGH`). Found for all lines at once with numpy; only the lines that this
    leaves in doubt are looked at one by one."""
    data = numpy.frombuffer(block, numpy.uint8)
    ends = numpy.flatnonzero(data == NEWLINE)
    if ends.size == 0 or ends[-1] != data.size - 1:
        ends = numpy.append(ends, data.size)  # the last line lacks its newline
    starts = numpy.concatenate(([0], ends[:-1] + 1))
    nonempty = ends > starts
    wide = nonempty.copy()
    wide[nonempty] = (data[starts[nonempty]] == OPEN) & (data[ends[nonempty] - 1] == CLOSE)
    if not all(_one_object_wide(block[starts[n] : ends[n]]) for n in numpy.flatnonzero(~wide)):
        return False
    doubtful = numpy.searchsorted(ends, _suspects(data))
    # every line holds an opening bracket: more than this many beyond one a line are needed
    # for one line to hold DEEP_ENOUGH
    opening = (data == OPEN) | (data == OPEN_LIST)
    if numpy.count_nonzero(opening) - ends.size + 1 >= DEEP_ENOUGH:
        brackets = numpy.flatnonzero(opening)
        per_line = numpy.searchsorted(brackets, ends) - numpy.searchsorted(brackets, starts)
        doubtful = numpy.concatenate((doubtful, numpy.flatnonzero(per_line >= DEEP_ENOUGH)))
    limit = sys.get_int_max_str_digits()  # 0: no limit
    if limit:
        doubtful = numpy.concatenate(
            (doubtful, numpy.searchsorted(ends, _long_digits(data, limit)))
        )
    lines = sorted(set(doubtful.tolist()))
    return not any(_python_refuses(block[starts[n] : ends[n]]) for n in lines)


def _long_digits(data: numpy.ndarray, limit: int) -> numpy.ndarray:
    """A position inside each run of more than ``limit`` ASCII digits in ``data`` (and in some
    shorter runs). An integer that long is a ValueError for Python's json (the interpreter's
    limit on converting digits to an int, ``sys.get_int_max_str_digits``) and a number for
    pyarrow. Only every ``step``-th byte is read: such a run holds two consecutive ones."""
    step = max(1, (limit + 1) // 2)
    sampled = _IS_DIGIT[data[::step]]
    return numpy.flatnonzero(sampled[:-1] & sampled[1:]) * step


def _suspects(data: numpy.ndarray) -> numpy.ndarray:
    """Where a suspect (:data:`SUSPECTS`) starts in ``data``: an Inf (of Infinity aside) or a
    NaN where a bare value could start, a byte-order mark anywhere."""
    found = []
    for suspect in SUSPECTS:
        at = numpy.flatnonzero(data[: max(0, data.size - len(suspect) + 1)] == suspect[0])
        for offset, byte in enumerate(suspect[1:], start=1):
            at = at[data[at + offset] == byte]
        if suspect == SUSPECTS[0]:
            tail = at + len(suspect)
            infinity = numpy.ones(at.size, bool)
            for offset, byte in enumerate(INFINITY_TAIL):
                inside = tail + offset < data.size
                infinity &= inside & (data[numpy.where(inside, tail + offset, 0)] == byte)
            at = at[~infinity]
        if suspect != SUSPECTS[2]:
            at = at[_could_start_a_value(data, at)]
        found.append(at)
    return numpy.concatenate(found)


def _could_start_a_value(data: numpy.ndarray, at: numpy.ndarray) -> numpy.ndarray:
    """Which of the positions ``at`` follow a :data:`VALUE_OPENERS` byte (JSON whitespace
    between them aside), or lie too far past whitespace, or at the start, to tell."""
    before = at - 1
    for _ in range(WHITESPACE_LOOKED_PAST):
        spaced = (before >= 0) & _IS_WHITESPACE[data[numpy.maximum(before, 0)]]
        if not spaced.any():
            break
        before = before - spaced
    return (before < 0) | _IS_OPENER_OR_WHITESPACE[data[numpy.maximum(before, 0)]]


def _byte_table(members: bytes) -> numpy.ndarray:
    """For each byte value, whether it is one of ``members``."""
    table = numpy.zeros(256, bool)
    table[numpy.frombuffer(members, numpy.uint8)] = True
    return table


_IS_WHITESPACE = _byte_table(JSON_WHITESPACE)
_IS_DIGIT = _byte_table(b"0123456789")
_IS_OPENER_OR_WHITESPACE = _byte_table(VALUE_OPENERS + JSON_WHITESPACE)


def _one_object_wide(line: bytes) -> bool:
    """Whether ``line`` opens an object at its first byte and closes one at its last (JSON
    whitespace aside): then pyarrow starts a new row at each line, and as many rows as lines
    means one row a line."""
    value = line.strip(JSON_WHITESPACE)
    return value[:1] == b"{" and value[-1:] == b"}"


def _python_refuses(line: bytes) -> bool:
    """Whether Python's json refuses ``line`` (UTF-8): not JSON, or nested too deep."""
    try:
        json.loads(line.decode("utf-8"))
    except (ValueError, RecursionError):
        return True
    return False


def _strings(awkward: Any, data: numpy.ndarray, offsets: numpy.ndarray) -> Any:
    """An awkward array of the strings in ``data`` at ``offsets``, over the same buffers."""
    characters = awkward.contents.NumpyArray(data, parameters={"__array__": "char"})
    strings = awkward.contents.ListOffsetArray(
        awkward.index.Index64(offsets), characters, parameters={"__array__": "string"}
    )
    return awkward.Array(strings)

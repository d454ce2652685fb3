"""What encoding gives back: the documents of a chunk, per json key, as flat arrays ready for
the bulk writer (``IndexedDatasetBuilder.add_documents``)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy

#: the most tokens a sequence holds: its length is an int32 in the ``.idx``
MAX_SEQUENCE_TOKENS = 2**31 - 1


def sequence_lengths(lengths: numpy.ndarray | list[int]) -> numpy.ndarray:
    """``lengths`` as the int32 the ``.idx`` stores; an ``OverflowError`` naming the longest
    where one passes :data:`MAX_SEQUENCE_TOKENS` (a cast would wrap it silently)."""
    wide = numpy.asarray(lengths, dtype=numpy.int64)
    if wide.size and int(wide.max()) > MAX_SEQUENCE_TOKENS:
        raise OverflowError(too_long("a sequence", int(wide.max())))
    return wide.astype(numpy.int32)


def too_long(what: str, tokens: int) -> str:
    """Why ``what`` (a sequence, a sentence) of ``tokens`` tokens cannot be written."""
    return (
        f"{what} of {tokens} tokens; a sequence holds at most {MAX_SEQUENCE_TOKENS} (its "
        "length is an int32 in the .idx)"
    )


@dataclass
class EncodedKey:
    """The documents of one json key in one chunk, ready for ``add_documents``."""

    tokens: numpy.ndarray
    sequence_lengths: numpy.ndarray
    sequences_per_document: numpy.ndarray

    def select(self, documents: numpy.ndarray) -> EncodedKey:
        """The documents where the boolean mask ``documents`` is true."""
        count = self.sequences_per_document.size
        document_of_sequence = numpy.repeat(numpy.arange(count), self.sequences_per_document)
        tokens_per_document = numpy.bincount(
            document_of_sequence, weights=self.sequence_lengths, minlength=count
        ).astype(numpy.int64)
        return EncodedKey(
            self.tokens[numpy.repeat(documents, tokens_per_document)],
            self.sequence_lengths[numpy.repeat(documents, self.sequences_per_document)],
            self.sequences_per_document[documents],
        )


@dataclass
class EncodedChunk:
    file: str
    start: int
    documents: numpy.ndarray
    """The offset in the chunk of each line that became a document."""
    keys: dict[str, EncodedKey]
    bad_lines: list[tuple[int, str]] = field(default_factory=list)
    """(line number in ``file``, why) of each line that did not."""
    nbytes: int = 0

    @property
    def tokens(self) -> int:
        return sum(int(key.tokens.size) for key in self.keys.values())

"""Encoding texts a word at a time, each distinct word once per process.

The byte-level BPE tokenizers of tokenizer.json files (GPT-2's, Llama 3's, Qwen2's, Mistral's
Tekken, GPT-4o's) first cut a text into pieces with a regex, then encode each piece
on its own. In each of those regexes (:data:`SEGMENTABLE_PATTERNS`) a branch that has taken a
non-whitespace character goes on only with classes that leave the space out; the one lookahead,
``(?!\\S)``, follows whitespace only and cannot tell a space from the end of the text; nothing
looks behind. So no piece runs from a non-whitespace character into a space after it, and a text
cut before each space that follows a non-whitespace character falls into segments that the
tokenizer, given each one alone, encodes to exactly the ids it gives them inside the text.

Text repeats its words, and so its segments: each distinct segment is encoded once and looked
up after that, which saves the tokenizer's per-character work, the bulk of its time. A tokenizer
uses this only where the cut is proven for it: its pattern, and the rest of its pipeline
(:mod:`megafmt.tokenizers.huggingface_segments`).

Whitespace here is every character that Python's ``re`` or Oniguruma (the regex engine of
``tokenizers``) counts as whitespace in any Unicode version since 4: counting more characters
only means fewer cuts. (``tiktoken`` encodes faster whole than this does by segments.)
"""

from __future__ import annotations

import itertools
import re
import time
from collections.abc import Callable, Sequence

#: The pre-tokenizing regexes the cut is proven for (see the module docstring), as tokenizer.json
#: files (and Megatron, for Tekken's) write them.
GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
TEKKEN_PATTERN = (  # Megatron's tiktoken v2
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
GPT4O_PATTERN = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SEGMENTABLE_PATTERNS = frozenset(
    {
        GPT2_PATTERN,
        LLAMA3_PATTERN,
        QWEN2_PATTERN,
        TEKKEN_PATTERN,
        GPT4O_PATTERN,
    }
)

#: Characters some engine counts as whitespace beyond Python's ``str.isspace``: U+180E (until
#: Unicode 6.3) and U+200B (until 4.0.1).
FORMER_WHITESPACE = "\u180e\u200b"
_WHITESPACE_THEN_SPACE = re.compile(f"[\\s{FORMER_WHITESPACE}] ")
_SPACE_AFTER_NON_WHITESPACE = re.compile(f"(?<=[^\\s{FORMER_WHITESPACE}]) ")

#: How many first segments, and how many later ones, a process keeps the ids of; past it that
#: cache starts again (about 25 MiB each when full, for segments of 6 characters and 2 ids;
#: a batch's own segments come on top).
CAPACITY = 1 << 17
#: Segments longer than this (characters) are encoded each time, not kept.
LONGEST = 64
#: A batch whose new segments hold more than this share of its characters may be encoded
#: faster whole (code, say, whose rare pieces are the costly ones): both ways are timed.
MOSTLY_NEW = 0.25
#: While texts are encoded whole, every this many batches one goes by segments again.
RETRY_EVERY = 8


def cut(text: str) -> list[str]:
    """``text`` cut before each space that follows a non-whitespace character: the first
    segment whole, each later one without the space it starts with."""
    if text.startswith(" ") or _WHITESPACE_THEN_SPACE.search(text) is not None:
        return _SPACE_AFTER_NON_WHITESPACE.split(text)
    return text.split(" ")  # every space follows a non-whitespace character


class SegmentEncoder:
    """Encodes texts segment by segment (see :func:`cut`), each distinct segment once, or whole
    where that is faster.

    ``encode`` is the tokenizer's own encoding of a list of texts, each alone: it is given the
    segments not seen before, or the texts. Which of the two is faster depends on the text;
    both are timed per character and the faster one kept (the ids are the same either way).
    """

    def __init__(
        self,
        encode: Callable[[list[str]], list[list[int]]],
        capacity: int = CAPACITY,
        longest: int = LONGEST,
        mostly_new: float = MOSTLY_NEW,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._encode = encode
        self._mostly_new = mostly_new
        self._clock = clock
        self._capacity = capacity
        self._longest = longest
        self._first: dict[str, list[int]] = {}
        """The ids of a text's first segment."""
        self._spaced: dict[str, list[int]] = {}
        """The ids of ``" " + key``: a later segment."""
        self._interned: dict[int, int] = {}
        self._seconds_per_character: dict[bool, float] = {}
        """By segments (True) and whole (False): the last batch's time per character."""
        self._by_segments = True
        self._whole_batches = 0

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """The ids of each text, equal to ``encode`` of the text alone."""
        characters = max(1, sum(map(len, texts)))
        by_segments = self._by_segments
        if not by_segments:
            self._whole_batches += 1
            by_segments = self._whole_batches % RETRY_EVERY == 0
        start = self._clock()
        if by_segments:
            encoded, new_characters = self._encode_by_segments(texts)
        else:
            encoded, new_characters = self._encode(list(texts)), characters
        self._seconds_per_character[by_segments] = (self._clock() - start) / characters
        segments_time = self._seconds_per_character.get(True, 0.0)
        whole_time = self._seconds_per_character.get(False, 0.0)
        if by_segments and new_characters > self._mostly_new * characters:
            self._by_segments = 0 < segments_time < whole_time  # whole untimed: time it next
        elif not by_segments:
            self._by_segments = segments_time < whole_time
        return encoded

    def _encode_by_segments(self, texts: Sequence[str]) -> tuple[list[list[int]], int]:
        """The ids of each text, and how many characters the new segments held."""
        segments = [cut(text) for text in texts]
        firsts = {parts[0] for parts in segments}
        spaced = set().union(*(itertools.islice(parts, 1, None) for parts in segments))
        new_firsts = self._missing(self._first, firsts)
        new_spaced = self._missing(self._spaced, spaced)
        new = [*new_firsts, *(" " + segment for segment in new_spaced)]
        if new:
            intern = self._interned.setdefault  # one int object per id, however many segments
            ids = [list(map(intern, sequence, sequence)) for sequence in self._encode(new)]
            count = len(new_firsts)
            self._first.update(zip(new_firsts, ids[:count], strict=True))
            self._spaced.update(zip(new_spaced, ids[count:], strict=True))
        first, later = self._first, self._spaced.__getitem__
        encoded = [
            first[parts[0]]
            + list(itertools.chain.from_iterable(map(later, itertools.islice(parts, 1, None))))
            for parts in segments
        ]
        for cache, added in ((self._first, new_firsts), (self._spaced, new_spaced)):
            for segment in added:
                if len(segment) > self._longest:
                    del cache[segment]
        return encoded, sum(map(len, new))

    def _missing(self, cache: dict[str, list[int]], wanted: set[str]) -> list[str]:
        """The segments of ``wanted`` to encode; the cache emptied first when they would not
        fit (then all of them)."""
        missing = wanted.difference(cache)
        if len(cache) + len(missing) > self._capacity:
            cache.clear()
            missing = wanted
        return list(missing)

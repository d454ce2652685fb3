"""Which library encodes a tokenizer.json's texts: gigatoken where it gives the reference
library's ids for this very tokenizer, else the reference library (``tokenizers``) itself.

Exactness is established, not assumed. Before a run the gigatoken encoder of the run's
tokenizer (its added tokens and their flags included) encodes a stress sample
(:func:`stress_texts`: every kind of whitespace, the tokenizer's own added tokens beside text,
contractions, long words, digits, emoji, CJK, combining marks, empty texts) and must give the
reference library's whole-text ids for each text; where one differs, or gigatoken cannot load the
tokenizer, the run encodes with the reference library and :class:`BackendChoice` says why in one
line. ``backend="gigatoken"`` makes a failed check an error instead of a fallback.

The check runs once per process and tokenizer (:data:`_VERDICTS`, by the tokenizer's digest):
the same tokenizer loaded again, and the workers a checked run forks, build the encoder
without encoding the stress sample again. Its verdict is also remembered on disk for the next
run with the same tokenizer, sample and library versions (:mod:`megafmt.tokenizers.verdicts`).

The post-processor's fixed ids around a single text (a BOS, say) are added here (gigatoken
encodes the text alone); a post-processor that does more than that keeps the reference library.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy

from megafmt.errors import PluginError
from megafmt.tokenizers.verdicts import Verdict, remember, remembered, verdict_key

#: ``--tokenizer-backend`` values: check gigatoken and fall back, gigatoken or fail, reference
AUTO, GIGATOKEN, REFERENCE = "auto", "gigatoken", "reference"
BACKENDS = (AUTO, GIGATOKEN, REFERENCE)

#: the check's verdict on each tokenizer this process (or the one that forked it) checked:
#: its digest -> whether gigatoken passed, and the line saying why
_VERDICTS: dict[str, tuple[bool, str]] = {}

#: every character Python, Oniguruma or a pre-tokenizer regex may count as whitespace
WHITESPACE = (
    " ",
    "  ",
    "\t",
    "\n",
    "\r\n",
    "\r",
    "\x0b",
    "\x0c",
    "\x1c",
    "\x85",
    "\xa0",
    "\u1680",
    "\u180e",
    "\u2002",
    "\u2009",
    "\u200b",
    "\u2028",
    "\u2029",
    "\u202f",
    "\u205f",
    "\u3000",
    "\ufeff",
    " \n ",
    "\n\n\n",
    "   \t",
)
#: texts of each hard kind (a word beside them where a border could matter)
HARD_TEXTS = (
    "",
    "I'm you're we've they'll she'd it's don't DON'T 'S 'sup o'clock",
    "a" * 300,
    "pneumonoultramicroscopicsilicovolcanoconiosis" * 8,
    "1234567890 3.14159 1,000,000 0x1F 007 12345678901234567890",
    "🙂👍🏽👨‍👩‍👧‍👦 🇺🇸 ❤️ 🧪x",
    "東京都は日本の首都です。한국어 テスト ｶﾀｶﾅ",
    "e\u0301 nai\u0308ve a\u0308\u0301 \u0301start हिन्दी مرحبا Ωμέγα Привет",
    "def f(x):\n    return x**2  # ok\n\tif a != b: pass\r\n",
    "\ufb01 \u2460 \uff21\uff22\uff23 \xbd \u212b \xc5",
    "http://example.com/a?b=c&d=e#f <tag attr='v'>text</tag>",
    "!!!??? ... --- ___ *** ~~~ \\\\ // ||",
)


#: at most this many of a tokenizer's added tokens that hold whitespace are put beside each
#: added token in the stress sample (a code model may have dozens)
WHITESPACE_COMPANIONS = 8


def stress_texts(added_tokens: Sequence[str]) -> list[str]:
    """The stress sample for a tokenizer whose added (and special) tokens are
    ``added_tokens``: the hard texts, each whitespace beside words, and each added token
    alone, doubled, beside text with and without spaces (and runs of whitespace) on either
    side, and beside other added tokens: the next one in the list, and the first
    :data:`WHITESPACE_COMPANIONS` that hold whitespace (a token that strips the whitespace
    after it, followed by an added token of spaces, is where libraries part ways)."""
    texts = list(HARD_TEXTS)
    for space in WHITESPACE:
        texts += [space, f"word{space}word", f"{space}lead", f"trail{space}", f"a{space}{space}b"]
    spacious = [t for t in added_tokens if t != t.strip() or not t.strip()]
    for position, token in enumerate(added_tokens):
        texts += [
            token,
            token + token,
            f"a{token}b",
            f"a {token} b",
            f" {token}",
            f"{token} ",
            f"x  {token}\n y",
            f"word{token}",
            f"{token}word",
            f"\n{token}\t{token} end",
            f"{token}🙂東",
            f"{token}  fox",
            f"dog{token}   the",
            f"{token}\n\nx",
            f"x \n\n{token}",
            f"fox  {token}  ",
            f"{token}\t \n word",
        ]
        following = added_tokens[(position + 1) % len(added_tokens)]
        for companion in dict.fromkeys([following, *spacious[:WHITESPACE_COMPANIONS]]):
            texts += [
                token + companion,
                companion + token,
                f"{token}{companion}fox",
                f"x {token} {companion} y",
            ]
    return texts


@dataclass(frozen=True)
class BackendChoice:
    """The library a tokenizer encodes with, and why (one line for the run's log)."""

    backend: str
    """:data:`GIGATOKEN` or :data:`REFERENCE`."""
    reason: str


def fixed_ids(post_processor: dict[str, Any] | None) -> tuple[list[int], list[int]] | None:
    """The ids a tokenizer.json's post-processor puts before and after a single text, or None
    when it does more than add fixed ids."""
    if post_processor is None or post_processor.get("type") == "ByteLevel":
        return [], []
    kind = post_processor.get("type")
    if kind == "Sequence":
        parts = [fixed_ids(step) for step in post_processor.get("processors") or []]
        if any(part is None for part in parts):
            return None
        before = [i for part in reversed(parts) for i in part[0]]  # type: ignore[index]
        after = [i for part in parts for i in part[1]]  # type: ignore[index]
        return before, after
    if kind != "TemplateProcessing":
        return None
    specials = post_processor.get("special_tokens") or {}
    before, after, texts = [], [], 0
    for item in post_processor.get("single") or []:
        if "Sequence" in item:
            texts += 1
        elif "SpecialToken" in item and item["SpecialToken"].get("id") in specials:
            (after if texts else before).extend(specials[item["SpecialToken"]["id"]]["ids"])
        else:
            return None
    return (before, after) if texts == 1 else None


class GigatokenEncoder:
    """Ids through a ``gigatoken.Tokenizer``: a whole batch per call, the ids of all texts in
    one buffer, cut into one array per text (no Python int per token)."""

    def __init__(
        self,
        tokenizer: Any,
        before: Sequence[int] = (),
        after: Sequence[int] = (),
        renumber: numpy.ndarray | None = None,
    ) -> None:
        """``before`` and ``after``: fixed ids around each text (a post-processor's BOS, say);
        ``renumber``: our id of each of gigatoken's ids, where the two numberings differ."""
        self._tokenizer = tokenizer
        self._before = numpy.asarray(before, dtype=numpy.uint32)
        self._after = numpy.asarray(after, dtype=numpy.uint32)
        self._renumber = renumber

    @classmethod
    def from_json(cls, tokenizer_json: str, before: Sequence[int], after: Sequence[int]):
        """The encoder of a tokenizer.json's description (its added tokens included)."""
        gigatoken: Any = __import__("gigatoken")
        return cls(gigatoken.Tokenizer.from_json(tokenizer_json), before, after)

    def encode_array(self, text: str) -> numpy.ndarray:
        """The ids of one text, the fixed ids around them: gigatoken's single-text call, for
        callers that encode one piece at a time (fill-in-the-middle), where a batch of one
        would pay the batch's buffers and their cutting (about a thousand times the cost)."""
        ids = numpy.asarray(self._tokenizer.encode(text))
        if self._renumber is not None:
            ids = self._renumber[ids]
        return numpy.concatenate([self._before, ids, self._after])

    def encode_batch_arrays(
        self, texts: Sequence[str], parallel: bool | None = None
    ) -> list[numpy.ndarray]:
        """The ids of each text, the fixed ids around them; ``parallel`` as gigatoken takes it
        (None: its thread pool, except in a forked worker)."""
        flat, counts = self.encode_flat(list(texts), parallel)
        return numpy.split(flat, numpy.cumsum(counts)[:-1]) if len(counts) else []

    def encode_flat(
        self, texts: Any, parallel: bool | None = None
    ) -> tuple[numpy.ndarray, numpy.ndarray]:
        """The ids of all ``texts`` back to back, the fixed ids around each, and how many ids
        each text has: gigatoken's one buffer as it comes, for callers that never need an
        object per text. ``texts``: a list of str, or an awkward array of strings (whose
        buffers gigatoken reads in place)."""
        awkward: Any = __import__("awkward")
        rows = self._tokenizer.encode_batch(texts, parallel=parallel)
        flat = awkward.to_numpy(awkward.flatten(rows))
        counts = awkward.to_numpy(awkward.num(rows)).astype(numpy.int64)
        if self._renumber is not None:
            flat = self._renumber[flat]
        if not (self._before.size or self._after.size):
            return flat, counts
        return _around(flat, counts, self._before, self._after)


def _around(
    flat: numpy.ndarray, counts: numpy.ndarray, before: numpy.ndarray, after: numpy.ndarray
) -> tuple[numpy.ndarray, numpy.ndarray]:
    """``flat`` (texts of ``counts`` ids back to back) with ``before`` and ``after`` around
    each text, and the new counts."""
    wrapped = counts + before.size + after.size
    ends = numpy.cumsum(wrapped)
    starts = ends - wrapped
    out = numpy.empty(int(ends[-1]) if ends.size else 0, dtype=flat.dtype)
    text = numpy.ones(out.size, dtype=bool)
    fixed = [(starts + n, i) for n, i in enumerate(before)]
    fixed += [(ends - after.size + n, i) for n, i in enumerate(after)]
    for positions, token in fixed:
        out[positions] = token
        text[positions] = False
    out[text] = flat
    return out, wrapped


def choose_backend(
    backend: str,
    build: Callable[[], GigatokenEncoder],
    reference: Callable[[list[str]], list[list[int]]],
    added_tokens: Sequence[str],
    digest: str,
    library: str = "tokenizers",
) -> tuple[GigatokenEncoder | None, BackendChoice]:
    """The gigatoken encoder ``build`` makes if ``backend`` allows it and it passes the check
    against ``reference`` (the library's whole-text ids of a list of texts, text by text: a
    library's thread pool started before the run's workers fork stays off in them), with the
    choice and its reason (``library`` names the reference there). ``digest`` names the
    tokenizer (all that decides its ids): a tokenizer this process checked before is not
    checked again. Raises ``PluginError`` where ``backend`` is gigatoken and the check fails."""
    if backend == REFERENCE:
        return None, BackendChoice(REFERENCE, f"{library} (--tokenizer-backend reference)")
    encoder, why = _checked_once(build, reference, added_tokens, library, digest)
    if encoder is not None:
        return encoder, BackendChoice(GIGATOKEN, why)
    if backend == GIGATOKEN:
        raise PluginError(f"--tokenizer-backend gigatoken: {why}; use auto or reference")
    return None, BackendChoice(REFERENCE, f"{library}, not gigatoken: {why}")


def _checked_once(
    build: Callable[[], GigatokenEncoder],
    reference: Callable[[list[str]], list[list[int]]],
    added_tokens: Sequence[str],
    library: str,
    digest: str,
) -> tuple[GigatokenEncoder | None, str]:
    """:func:`_checked`, or its verdict on ``digest`` from before: this process's, else one
    remembered on disk (:mod:`megafmt.tokenizers.verdicts`); the encoder built again where it
    passed. The line says whether the check ran now or where its verdict was remembered."""
    verdict = _VERDICTS.get(digest)
    if verdict is not None:
        passed, why = verdict
        return (build() if passed else None), why
    texts = stress_texts(added_tokens)
    key = verdict_key(digest, texts, library)
    found = remembered(key) if key is not None else None
    encoder = None
    if found is not None:
        earlier, path = found
        with contextlib.suppress(Exception):  # it built before: a failure now checks again
            encoder = build() if earlier.passed else None
        if encoder is not None or not earlier.passed:
            why = f"{earlier.reason}; remembered from {path}"
            _VERDICTS[digest] = (earlier.passed, why)
            return encoder, why
    encoder, why, compared = _checked(build, reference, texts, library)
    # a verdict of the ids, not an error on the way (a load or an encode that raised: memory,
    # a library not installed, which the next run may not meet) is what the next run may reuse
    path = remember(key, Verdict(encoder is not None, why)) if key and compared else None
    why = f"{why}; checked now" + (f", remembered in {path}" if path else "")
    _VERDICTS[digest] = (encoder is not None, why)
    return encoder, why


def _checked(
    build: Callable[[], GigatokenEncoder],
    reference: Callable[[list[str]], list[list[int]]],
    texts: list[str],
    library: str,
) -> tuple[GigatokenEncoder | None, str, bool]:
    """The encoder and a line saying it passed on the stress sample ``texts``, or None and a
    line saying why not; and whether the ids were compared (False: an error came first)."""
    try:
        encoder = build()
    except ImportError:
        return None, "gigatoken is not installed (pip install gigatoken)", False
    except Exception as error:  # gigatoken's loader refuses a tokenizer with plain exceptions
        return None, f"gigatoken cannot load this tokenizer ({error})", False
    try:  # on this thread: a pool started here would be one more for the forked workers
        fast = [ids.tolist() for ids in encoder.encode_batch_arrays(texts, parallel=False)]
    except Exception as error:
        return None, f"gigatoken failed on the stress sample ({error})", False
    expected = reference(texts)
    for text, mine, theirs in zip(texts, fast, expected, strict=True):
        if mine != theirs:
            return (
                None,
                f"gigatoken gives {_short(mine)} for {text[:40]!r}, {library} {_short(theirs)}",
                True,
            )
    return encoder, f"gigatoken (equal to {library} on all {len(texts)} stress texts)", True


def _short(ids: list[int]) -> str:
    return str(ids) if len(ids) <= 12 else f"{str(ids[:12])[:-1]}, ... ({len(ids)} ids)]"

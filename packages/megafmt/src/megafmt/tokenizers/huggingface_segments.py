"""Whether a tokenizer.json can be encoded by segments (:mod:`megafmt.tokenizers.segments`).

It can when each stage of its pipeline keeps within the segments, read from the tokenizer's
own description:

- no normalizer, or NFC: NFC never joins a character to a space after it (a space composes
  with nothing before it and stops any reordering);
- a pre-tokenizer that is GPT-2's (``ByteLevel`` with its regex), or a ``Split`` by one of the
  proven patterns (isolated, not inverted) then a ``ByteLevel`` without its regex; a prefix
  space is added only at the start of the text or of a piece, where a segment starts too;
- a BPE model without dropout: the model sees one piece at a time;
- no added token that holds a space (a cut could fall inside it) or strips the whitespace on
  its right (it would reach into the next segment);
- no truncation, no padding;
- with special tokens added, a post-processor that adds none (``ByteLevel``), or a template for
  a single text with fixed tokens before and after it.

The segments a process has not seen yet are encoded together, joined by one of the
tokenizer's own added tokens (:func:`separator_of`): the library splits a text at its added
tokens before any other stage, so each segment is encoded as if alone, and the library's cost
per text (about 13 us, as much as 25 characters of text) is paid once per group of them. A
segment that holds the separator is encoded alone, and so is every segment of a group whose
separators did not all come back (never seen: a longer added token could take one in).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy

from megafmt.tokenizers.segments import GPT2_PATTERN, SEGMENTABLE_PATTERNS

#: About how many characters of texts are joined into one: long enough that the library's cost
#: per text is paid rarely, short enough to stay in the processor's caches (measured: 4 to 16 K
#: characters encode 30% faster than one text each, and 10% faster than 64 K).
GROUP_CHARACTERS = 8192


@dataclass(frozen=True)
class SegmentPlan:
    """How a tokenizer.json's encoding of a text is made of its segments' encodings."""

    prefix: tuple[int, ...] = ()
    """Ids the post-processor puts before the text's."""
    suffix: tuple[int, ...] = ()
    """Ids it puts after them."""
    separator: tuple[str, int] | None = None
    """The added token (and its id) that joins segments encoded together; None: one by one."""


def _pattern(pre_tokenizer: dict[str, Any] | None) -> str | None:
    """The regex that cuts text into pieces, if the pre-tokenizer is one of the two shapes."""
    if pre_tokenizer is None:
        return None
    if pre_tokenizer.get("type") == "ByteLevel":
        return GPT2_PATTERN if pre_tokenizer.get("use_regex", True) else None
    if pre_tokenizer.get("type") != "Sequence":
        return None
    steps = pre_tokenizer.get("pretokenizers") or []
    if len(steps) != 2:
        return None
    split, byte_level = steps
    if (
        split.get("type") != "Split"
        or split.get("behavior") != "Isolated"
        or split.get("invert")
        or byte_level.get("type") != "ByteLevel"
        or byte_level.get("use_regex", True)
    ):
        return None
    return (split.get("pattern") or {}).get("Regex")


def _template(post_processor: dict[str, Any] | None) -> SegmentPlan | None:
    """The fixed ids a post-processor puts around a single text, if that is all it does."""
    if post_processor is None:
        return SegmentPlan()
    kind = post_processor.get("type")
    if kind == "ByteLevel":
        return SegmentPlan()
    if kind == "Sequence":
        plans = [_template(step) for step in post_processor.get("processors") or []]
        if None in plans or sum(bool(p.prefix or p.suffix) for p in plans) > 1:
            return None
        return next((p for p in plans if p.prefix or p.suffix), SegmentPlan())
    if kind != "TemplateProcessing":
        return None
    specials = post_processor.get("special_tokens") or {}
    before: list[int] = []
    after: list[int] = []
    texts = 0
    for item in post_processor.get("single") or []:
        if "Sequence" in item:
            texts += 1
        elif "SpecialToken" in item and item["SpecialToken"].get("id") in specials:
            (after if texts else before).extend(specials[item["SpecialToken"]["id"]]["ids"])
        else:
            return None
    return SegmentPlan(tuple(before), tuple(after)) if texts == 1 else None


def separator_of(added_tokens: list[dict[str, Any]], model_ids: set[int]) -> tuple[str, int] | None:
    """An added token that can join texts encoded together (and its id): matched on the raw
    text, stripping nothing; with no border (no proper prefix that is also a suffix), so that
    where no text holds it the joined string holds it exactly at the joins; with no letter,
    digit or ``_`` at its ends, so that a ``single_word`` token beside it sees a word boundary
    as at a text's end; and with an id the model never gives a piece of text (not one of
    ``model_ids``)."""
    usable = [
        token
        for token in added_tokens
        if (content := token.get("content") or "")
        and not any(token.get(flag) for flag in ("lstrip", "rstrip", "single_word"))
        and not token.get("normalized")
        and not any(content[:k] == content[-k:] for k in range(1, len(content)))
        and not _word_character(content[0])
        and not _word_character(content[-1])
        and int(token["id"]) not in model_ids
    ]
    if not usable:
        return None
    # a special token, the longest: the least likely to be in a text
    best = max(usable, key=lambda token: (bool(token.get("special")), len(token["content"])))
    return best["content"], int(best["id"])


def producible_ids(model: dict[str, Any]) -> set[int]:
    """The ids a BPE model can give a piece of text: its single characters and what its merges
    make (every id, where a whole piece in the vocabulary skips the merges, or where prefixes
    and suffixes join in). A token of the vocabulary that no merge makes (a special token the
    trainer put there) it never gives."""
    vocab: dict[str, int] = model.get("vocab") or {}
    if any(
        model.get(key)
        for key in ("ignore_merges", "continuing_subword_prefix", "end_of_word_suffix")
    ):
        return set(vocab.values())
    merged = {
        "".join(merge.split(" ") if isinstance(merge, str) else merge)
        for merge in model.get("merges") or []
    }
    return {id for token, id in vocab.items() if len(token) == 1 or token in merged}


def _word_character(character: str) -> bool:
    return character.isalnum() or character == "_"


def segment_plan(tokenizer: Any, add_special_tokens: bool) -> SegmentPlan | None:
    """How ``tokenizer`` (a ``tokenizers.Tokenizer``) encodes a text from its segments, or
    None when that is not proven for it."""
    config = json.loads(tokenizer.to_str())
    normalizer = config.get("normalizer")
    if normalizer is not None and normalizer.get("type") != "NFC":
        return None
    if _pattern(config.get("pre_tokenizer")) not in SEGMENTABLE_PATTERNS:
        return None
    model = config.get("model") or {}
    if model.get("type") != "BPE" or model.get("dropout"):
        return None
    added = config.get("added_tokens") or []
    if any(" " in token.get("content", " ") or token.get("rstrip") for token in added):
        return None
    if config.get("truncation") is not None or config.get("padding") is not None:
        return None
    plan = _template(config.get("post_processor")) if add_special_tokens else SegmentPlan()
    separator = separator_of(added, producible_ids(model))
    return None if plan is None else dataclasses.replace(plan, separator=separator)


class JoinedEncoder:
    """Encodes a list of texts, each as if alone, in groups of about :data:`GROUP_CHARACTERS`
    joined by the plan's separator (see the module docstring)."""

    def __init__(self, encode: Callable[..., list[Any]], separator: tuple[str, int] | None) -> None:
        """``encode``: the library's batch encoding (``Tokenizer.encode_batch_fast``, or
        ``encode_batch`` where the library has no fast one)."""
        self._encode = encode
        self._separator = separator

    def __call__(self, texts: list[str]) -> list[list[int]]:
        """The ids of each of ``texts`` alone, no special tokens added."""
        encoded: list[list[int] | None] = [None] * len(texts)
        if self._separator is not None:
            separator, separator_id = self._separator
            plain = [position for position, text in enumerate(texts) if separator not in text]
            groups = _groups(plain, [len(texts[position]) + 1 for position in plain])
            joined = [separator.join(texts[position] for position in group) for group in groups]
            for group, encoding in zip(
                groups, self._encode(joined, add_special_tokens=False), strict=True
            ):
                ids = encoding.ids
                ends = numpy.flatnonzero(numpy.array(ids) == separator_id).tolist()
                if len(ends) != len(group) - 1:  # not kept apart: each alone, below
                    continue
                starts = [0, *(end + 1 for end in ends)]
                for position, a, b in zip(group, starts, [*ends, len(ids)], strict=True):
                    encoded[position] = ids[a:b]
        alone = [position for position, ids in enumerate(encoded) if ids is None]
        if alone:
            encodings = self._encode([texts[p] for p in alone], add_special_tokens=False)
            for position, encoding in zip(alone, encodings, strict=True):
                encoded[position] = encoding.ids
        return encoded  # type: ignore[return-value]


def _groups(items: list[int], sizes: list[int]) -> list[list[int]]:
    """``items`` in runs whose ``sizes`` add up to about :data:`GROUP_CHARACTERS`."""
    groups: list[list[int]] = []
    current: list[int] = []
    total = 0
    for item, size in zip(items, sizes, strict=True):
        current.append(item)
        total += size
        if total >= GROUP_CHARACTERS:
            groups.append(current)
            current, total = [], 0
    if current:
        groups.append(current)
    return groups

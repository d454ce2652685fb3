"""Encoding by segments (megafmt.tokenizers.segments): the cut, the cache, and the ids, compared
with the tokenizers library encoding each text whole, on seeded random texts full of the
characters where engines and Unicode versions disagree about whitespace."""

import itertools
import json
import random
import types

import pytest

from megafmt.tokenizers import TokenizerOptions, load_tokenizer
from megafmt.tokenizers.huggingface_segments import (
    JoinedEncoder,
    SegmentPlan,
    producible_ids,
    segment_plan,
    separator_of,
)
from megafmt.tokenizers.segments import (
    GPT4O_PATTERN,
    LLAMA3_PATTERN,
    QWEN2_PATTERN,
    RETRY_EVERY,
    TEKKEN_PATTERN,
    SegmentEncoder,
    cut,
)

tokenizers = pytest.importorskip("tokenizers")

# whitespace of every kind (Python's, Unicode's White_Space, U+180E and U+200B that once were),
# letters, marks, digits, punctuation, contractions, CJK, emoji, and the added tokens below
PIECES = [
    *" " * 12,
    "  ",
    "\n",
    "\r\n",
    "\t",
    "\x0b",
    "\x0c",
    "\x1c",
    "\x1f",
    "\x85",
    "\xa0",
    "\u1680",
    "\u180e",
    "\u2000",
    "\u200a",
    "\u200b",
    "\u2028",
    "\u202f",
    "\u3000",
    *"abcdeABCDE",
    "hello",
    "world",
    "Tokens",
    "e\u0301",
    "\u0301",
    "é",
    "ß",
    *"0123",
    "٣",
    "12345",
    *".,!?/-'\"()",
    "'s",
    "'LL",
    "'ve",
    "日本語",
    "🙂",
    "<eos>",
    "<mask>",
    "[X]",
]


def random_texts(seed, count=300):
    rng = random.Random(seed)
    return ["".join(rng.choice(PIECES) for _ in range(rng.randrange(0, 40))) for _ in range(count)]


def test_cut_rebuilds_the_text_and_cuts_only_before_a_space_after_non_whitespace():
    assert cut("") == [""]
    assert cut("a b") == ["a", "b"]
    assert cut("a  b") == ["a", " b"]  # the second space follows a space
    assert cut(" a b") == [" a", "b"]  # the first follows nothing
    assert cut("a\n b c") == ["a\n b", "c"]
    assert cut("a\u200b b") == ["a\u200b b"]  # once whitespace
    assert cut("a ") == ["a", ""]
    for text in random_texts(0, 2000):
        segments = cut(text)
        assert segments[0] + "".join(" " + s for s in segments[1:]) == text
        position = len(segments[0])
        for segment in segments[1:]:
            previous = text[position - 1]
            assert not previous.isspace() and previous not in "\u180e\u200b"
            position += 1 + len(segment)


def test_segment_encoder_caches_short_segments_only_and_stays_bounded():
    calls = []

    def encode(texts):
        calls.append(list(texts))
        return [[ord(c) for c in text] for text in texts]

    segments = SegmentEncoder(encode, capacity=4, longest=5, mostly_new=1.0)
    assert segments.encode_batch(["ab cd", "ab cd"]) == [[97, 98, 32, 99, 100]] * 2
    assert sorted(calls.pop()) == [" cd", "ab"]  # each distinct segment once
    assert segments.encode_batch(["ab cd"]) == [[97, 98, 32, 99, 100]]
    assert calls == []  # from the cache
    long = "abcdefgh"
    assert segments.encode_batch([f"ab {long}"]) == [[97, 98, 32, *map(ord, long)]]
    assert calls.pop() == [" " + long]
    segments.encode_batch([f"ab {long}"])
    assert calls.pop() == [" " + long]  # a long segment is encoded again, not kept
    texts = ["v w x y z", "ab cd"]  # more than the capacity: the cache starts again
    assert segments.encode_batch(texts) == [[ord(c) for c in t] for t in texts]
    assert sorted(calls.pop()) == [" cd", " w", " x", " y", " z", "v"]  # "ab" still fits


def test_texts_go_whole_while_that_is_faster_and_by_segments_again_when_it_is_not():
    """A clock that the encoding advances by ``cost`` per character, by segments or whole."""
    now = [0.0]
    cost = {"segments": 2.0, "whole": 1.0}
    calls = []
    batch = []

    def encode(texts):
        mode = "w" if texts == batch else "s"
        calls.append(mode)
        now[0] += cost[{"w": "whole", "s": "segments"}[mode]] * sum(map(len, texts))
        return [[ord(c) for c in text] for text in texts]

    segments = SegmentEncoder(encode, clock=lambda: now[0])

    fresh = itertools.count()

    def run(count, words=None):
        """The calls ``count`` batches make: s, by segments; w, whole."""
        calls.clear()
        for _ in range(count):
            batch[:] = [" ".join(words or (f"w{next(fresh)}" for _ in range(20)))]
            assert segments.encode_batch(batch) == [[ord(c) for c in batch[0]]]
        return "".join(calls)

    # new words, by segments slower: timed whole once, then whole, by segments every 8th batch
    assert run(1) == "s"
    assert run(RETRY_EVERY + 1) == "w" * (RETRY_EVERY - 1) + "s" + "w"
    # by segments turns faster: kept from its next try on, new words or not
    cost["segments"] = 0.5
    assert run(RETRY_EVERY) == "w" * (RETRY_EVERY - 2) + "s" + "s"
    assert run(1, ["a", "b"]) == "s"
    # known words cost nothing to encode: no time is compared, no batch goes whole
    cost["segments"] = 5.0
    assert run(3, ["a", "b"]) == ""


def tokenizer_of(pre_tokenizer, normalizer=None, added=(), post_processor=None):
    """A byte-level BPE trained on random texts with ``pre_tokenizer``."""
    tokenizer = tokenizers.Tokenizer(tokenizers.models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizer
    tokenizer.normalizer = normalizer
    tokenizer.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=["<eos>", "<s>"],
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(
        random_texts(99, 500) + ["hello world, hello tokens"] * 50, trainer
    )
    tokenizer.add_tokens(list(added))
    if post_processor is not None:
        tokenizer.post_processor = post_processor
    return tokenizer


def split_then_bytes(pattern, add_prefix_space=False):
    return tokenizers.pre_tokenizers.Sequence(
        [
            tokenizers.pre_tokenizers.Split(
                tokenizers.Regex(pattern), behavior="isolated", invert=False
            ),
            tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space, use_regex=False),
        ]
    )


def byte_level(add_prefix_space=False):
    return tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space)


AddedToken = tokenizers.AddedToken
SHAPES = {
    "gpt2": lambda: tokenizer_of(byte_level()),
    "gpt2 prefix space": lambda: tokenizer_of(byte_level(add_prefix_space=True)),
    "llama3": lambda: tokenizer_of(split_then_bytes(LLAMA3_PATTERN)),
    "qwen2 nfc": lambda: tokenizer_of(
        split_then_bytes(QWEN2_PATTERN), normalizer=tokenizers.normalizers.NFC()
    ),
    "tekken prefix space": lambda: tokenizer_of(split_then_bytes(TEKKEN_PATTERN, True)),
    "gpt4o": lambda: tokenizer_of(split_then_bytes(GPT4O_PATTERN)),
    "added tokens": lambda: tokenizer_of(
        byte_level(),
        added=[
            AddedToken("<mask>", lstrip=True),
            AddedToken("[X]", single_word=True),
            AddedToken("\n\n", normalized=False),
        ],
    ),
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_segments_give_the_ids_of_the_whole_text(shape):
    tokenizer = SHAPES[shape]()
    plan = segment_plan(tokenizer, add_special_tokens=False)
    assert (plan.prefix, plan.suffix, plan.separator) == ((), (), ("<eos>", 0))
    segments = SegmentEncoder(JoinedEncoder(tokenizer.encode_batch, plan.separator), mostly_new=1.0)
    for seed in range(3):
        texts = random_texts(seed)
        whole = [e.ids for e in tokenizer.encode_batch(texts, add_special_tokens=False)]
        assert segments.encode_batch(texts) == whole


def test_a_template_puts_its_tokens_around_the_segments(tmp_path):
    template = tokenizers.processors.TemplateProcessing(
        single="<s> $A <eos>", special_tokens=[("<s>", 1), ("<eos>", 0)]
    )
    processors = tokenizers.processors.Sequence(
        [tokenizers.processors.ByteLevel(trim_offsets=False), template]
    )
    trained = tokenizer_of(split_then_bytes(LLAMA3_PATTERN), post_processor=processors)
    assert segment_plan(trained, add_special_tokens=True) == SegmentPlan((1,), (0,), ("<eos>", 0))
    trained.save(str(tmp_path / "tokenizer.json"))
    # the plugin, with special tokens added as the seed commit adds them
    tokenizer = load_tokenizer("huggingface", TokenizerOptions(model=str(tmp_path)))
    texts = ["", *random_texts(5)]
    assert tokenizer.encode_batch(texts) == [e.ids for e in trained.encode_batch(texts)]
    assert tokenizer.encode_batch(["hello"])[0][::2] == [1, 0]


def refusals():
    """Tokenizers the cut is not proven for, each with why."""
    gpt2 = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    yield "a space in an added token", tokenizer_of(gpt2, added=["a b"])
    yield (
        "an added token strips on its right",
        tokenizer_of(gpt2, added=[AddedToken("<mask>", rstrip=True)]),
    )
    yield "no regex", tokenizer_of(tokenizers.pre_tokenizers.ByteLevel(use_regex=False))
    yield "another pattern", tokenizer_of(split_then_bytes(r"\S+|\s+"))
    yield "whitespace split", tokenizer_of(tokenizers.pre_tokenizers.Whitespace())
    yield "a lowercasing normalizer", tokenizer_of(gpt2, tokenizers.normalizers.Lowercase())
    truncated = tokenizer_of(gpt2)
    truncated.enable_truncation(16)
    yield "truncation", truncated
    padded = tokenizer_of(gpt2)
    padded.enable_padding()
    yield "padding", padded
    config = json.loads(tokenizer_of(gpt2).to_str())
    config["model"]["dropout"] = 0.1
    yield "BPE dropout", tokenizers.Tokenizer.from_str(json.dumps(config))


@pytest.mark.parametrize("why", [why for why, _ in refusals()])
def test_a_tokenizer_the_cut_is_not_proven_for_is_encoded_whole(why):
    tokenizer = dict(refusals())[why]
    assert segment_plan(tokenizer, add_special_tokens=False) is None


def test_special_tokens_need_a_plain_template():
    roberta = tokenizers.processors.RobertaProcessing(("</s>", 0), ("<s>", 1))
    tokenizer = tokenizer_of(byte_level(), post_processor=roberta)
    assert segment_plan(tokenizer, add_special_tokens=False).prefix == ()
    assert segment_plan(tokenizer, add_special_tokens=True) is None


def test_joined_texts_come_back_apart_and_a_text_holding_the_separator_alone():
    tokenizer = SHAPES["gpt2"]()
    texts = random_texts(7, 2000)  # many groups of GROUP_CHARACTERS; some hold "<eos>"
    assert 0 < sum("<eos>" in text for text in texts) < len(texts) / 2
    alone = [e.ids for e in tokenizer.encode_batch(texts, add_special_tokens=False)]
    for separator in (("<eos>", 0), None):  # joined by it, or one by one
        assert JoinedEncoder(tokenizer.encode_batch, separator)(texts) == alone
    assert JoinedEncoder(tokenizer.encode_batch, ("<eos>", 0))([]) == []


def test_the_separator_is_a_raw_added_token_without_border_or_stripping():
    def token(content, id, **flags):
        return {"content": content, "id": id, "special": True, "normalized": False, **flags}

    assert separator_of([], set()) is None
    best = [token("<s>", 1), token("<|endoftext|>", 0)]
    assert separator_of(best, {5, 6}) == ("<|endoftext|>", 0)
    assert separator_of(best, {0}) == ("<s>", 1)  # an id the model gives text is no separator
    assert separator_of([token("<s>", 1), token("<pad>", 2, special=False)], set()) == ("<s>", 1)
    refused = [
        token("<s><s", 3),  # "<s" begins and ends it: a second one could overlap a join
        token("aba", 4),
        token("<mask>", 5, lstrip=True),
        token("<x>", 6, single_word=True),
        token("<y>", 7, normalized=True),
        token("", 8),
        token("sep>", 9),  # a word character at an end: single_word tokens see it
        token("<sep_", 10),
    ]
    assert separator_of(refused, set()) is None


def test_the_ids_a_bpe_model_can_give_text_are_its_characters_and_merges():
    model = {"vocab": {"a": 0, "b": 1, "ab": 2, "<s>": 3, "abb": 4}, "merges": ["a b", ["ab", "b"]]}
    assert producible_ids(model) == {0, 1, 2, 4}
    assert producible_ids(model | {"ignore_merges": True}) == {0, 1, 2, 3, 4}


def test_joined_ids_hold_beside_single_word_tokens_and_model_ids_of_added_tokens():
    """A single_word token beside the separator, and an added token that is also a byte-level
    vocabulary string (its id the model's for "\\n"): found by a review, refused since."""
    tokenizer = SHAPES["gpt2"]()
    tokenizer.add_special_tokens([AddedToken("xyzsep", normalized=False)])
    tokenizer.add_tokens([AddedToken("foo", single_word=True, normalized=False)])
    tokenizer.add_special_tokens([AddedToken("Ċ", normalized=False)])  # the model's "\n"
    tokenizer.add_tokens([AddedToken("qĊ", normalized=False)])
    plan = segment_plan(tokenizer, add_special_tokens=False)
    assert plan.separator == ("<eos>", 0)
    texts = ["a", "foo", "foo", "b", "aq", "b", "x\ny", "c"] * 300
    alone = [e.ids for e in tokenizer.encode_batch(texts, add_special_tokens=False)]
    assert JoinedEncoder(tokenizer.encode_batch, plan.separator)(texts) == alone


def test_a_group_the_library_did_not_keep_apart_is_encoded_text_by_text():
    """Should the separator ever not come back where it was put, the group's texts are each
    encoded alone by the library: never ids split at a wrong place."""
    tokenizer = SHAPES["gpt2"]()
    calls = []

    def losing_a_separator(texts, add_special_tokens):
        """The library, but the first joined group loses its separators."""
        calls.append(len(texts))
        encodings = tokenizer.encode_batch(texts, add_special_tokens=add_special_tokens)
        if len(calls) > 1:
            return encodings
        broken = types.SimpleNamespace(ids=[i for i in encodings[0].ids if i != 0])
        return [broken, *encodings[1:]]

    texts = random_texts(8, 600)
    joined = JoinedEncoder(losing_a_separator, ("<eos>", 0))
    assert joined(texts) == [e.ids for e in tokenizer.encode_batch(texts, add_special_tokens=False)]
    assert len(calls) == 2  # the joined groups, then the lost group's texts one by one

"""Seeded random tokenizer.json files and adversarial texts: megafmt's ids (gigatoken where its
self-check passes, and the reference library) against the seed commit's HuggingFaceTokenizer.

Each case draws a BPE tokenizer trained here on texts of several scripts: a pre-tokenizer
(GPT-2's byte level with or without a prefix space, a Split regex then byte level, Metaspace, a
sentencepiece-style normalizer with byte fallback, plain whitespace with an unknown token), added
tokens with every flag (lstrip, rstrip, single_word, normalized, special), a post-processor
(none, ByteLevel, templates adding a BOS and/or an EOS), a tokenizer_config.json naming some of
them (a RoBERTa-style ``<mask>`` with lstrip among them), and the flags that change the ids
(``--tokenizer-hf-no-include-special-tokens``, ``--tokenizer-special-tokens``). The texts are
the backend's stress sample and random runs of words, whitespace of every kind, the added tokens,
characters outside the vocabulary and empty texts.

Where the seed's tokenizer gives None for a token (transformers cannot map an added token that
the config also declares special back to its id), its tool fails on the text; such texts are
left out.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import pytest

from megafmt.cli.tokenizer_flags import add_tokenizer_arguments, tokenizer_options
from megafmt.tokenizers import load_tokenizer
from megafmt.tokenizers.fast_backend import WHITESPACE, stress_texts

tokenizers = pytest.importorskip("tokenizers")
pytest.importorskip("gigatoken")

CASES = 10
WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "don't", "data", "tokens",
         "ünïcödé", "東京", "🙂", "naïve", "Ωμέγα", "Привет", "مرحبا", ",", ".", "!", "\n", "\t",
         "  "]  # fmt: skip
#: tokens a case may add, with flags drawn for each
ADDED = ["<mask>", "<|sep|>", "[X]", "<tok_a>", "ab", "##", "<s>", "</s>", "x y", "🙂", "\n\n"]
#: characters the vocabulary is unlikely to hold
RARE = ["\U0001f9ea", "ꙮ", "\u0378", "\U0001d518", "\x00", "\x7f", "ǅ", "ﷺ"]
SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def load(flags: list[str]):
    """Our tokenizer for Megatron's command line ``flags``."""
    parser = argparse.ArgumentParser()
    add_tokenizer_arguments(parser, None, "")
    args = parser.parse_args(flags)
    return load_tokenizer(args.tokenizer_type, tokenizer_options(args))


def training_texts(rng: random.Random) -> list[str]:
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randrange(1, 30))) for _ in range(300)]


def random_model(rng: random.Random, kind: str):
    """An untrained tokenizer of ``kind`` and its trainer."""
    pre, norm, dec = tokenizers.pre_tokenizers, tokenizers.normalizers, tokenizers.decoders
    specials = ["<s>", "</s>", "<unk>"]
    if kind in ("bytelevel", "split"):
        tokenizer = tokenizers.Tokenizer(tokenizers.models.BPE())
        if kind == "bytelevel":
            tokenizer.pre_tokenizer = pre.ByteLevel(add_prefix_space=rng.random() < 0.3)
        else:
            split = pre.Split(tokenizers.Regex(SPLIT_PATTERN), "isolated")
            tokenizer.pre_tokenizer = pre.Sequence([split, pre.ByteLevel(use_regex=False)])
        tokenizer.decoder = dec.ByteLevel()
        if rng.random() < 0.3:
            tokenizer.normalizer = norm.NFC()
        alphabet = pre.ByteLevel.alphabet()
    else:
        tokenizer = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token="<unk>"))
        if kind == "metaspace":
            scheme = rng.choice(["always", "first", "never"])
            tokenizer.pre_tokenizer = pre.Metaspace(prepend_scheme=scheme)
            tokenizer.decoder = dec.Metaspace(prepend_scheme=scheme)
        elif kind == "llama":
            tokenizer.normalizer = norm.Sequence([norm.Prepend("▁"), norm.Replace(" ", "▁")])
        else:
            tokenizer.pre_tokenizer = pre.Whitespace()
        alphabet = []
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=rng.choice([300, 600]), special_tokens=specials, initial_alphabet=alphabet
    )
    return tokenizer, trainer


def with_byte_fallback(tokenizer):
    """The trained BPE again with the 256 ``<0xNN>`` tokens and byte fallback."""
    model = json.loads(tokenizer.to_str())["model"]
    vocab = dict(model["vocab"])
    for byte in range(256):
        vocab.setdefault(f"<0x{byte:02X}>", len(vocab))
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    tokenizer.model = tokenizers.models.BPE(vocab, merges, unk_token="<unk>", byte_fallback=True)
    return tokenizer


def random_tokenizer(rng: random.Random, folder: Path) -> tuple[list[str], list[str]]:
    """A random tokenizer.json and tokenizer_config.json in ``folder``; its added tokens and the
    command line's extra flags."""
    kind = rng.choice(["bytelevel", "bytelevel", "split", "metaspace", "llama", "whitespace"])
    tokenizer, trainer = random_model(rng, kind)
    tokenizer.train_from_iterator(training_texts(rng), trainer)
    if kind in ("metaspace", "llama") and rng.random() < 0.8:
        tokenizer = with_byte_fallback(tokenizer)
    added = rng.sample(ADDED, rng.randrange(0, 5))
    for content in added:
        token = tokenizers.AddedToken(
            content,
            single_word=rng.random() < 0.3,
            lstrip=rng.random() < 0.4,
            rstrip=rng.random() < 0.4,
            normalized=rng.random() < 0.3,
            special=rng.random() < 0.6,
        )
        (tokenizer.add_special_tokens if rng.random() < 0.6 else tokenizer.add_tokens)([token])
    processors = tokenizers.processors
    bos, eos = tokenizer.token_to_id("<s>"), tokenizer.token_to_id("</s>")
    template = rng.choice([None, "byte", "<s> $A", "$A </s>", "<s> $A </s>"])
    if template == "byte":
        tokenizer.post_processor = processors.ByteLevel(trim_offsets=True)
    elif template:
        tokenizer.post_processor = processors.TemplateProcessing(
            single=template, special_tokens=[("<s>", bos), ("</s>", eos)]
        )
    tokenizer.save(str(folder / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "</s>"}
    if "<mask>" in added or rng.random() < 0.3:
        config["mask_token"] = "<mask>"
    if added and rng.random() < 0.5:
        config["additional_special_tokens"] = rng.sample(added, 1)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    flags = []
    if rng.random() < 0.3:
        flags.append("--tokenizer-hf-no-include-special-tokens")
    if rng.random() < 0.3:
        flags += ["--tokenizer-special-tokens", "<new>", *rng.sample(ADDED, 1)]
    return [*added, "<s>", "</s>", "<mask>", "<new>"], flags


def adversarial_texts(rng: random.Random, added: list[str]) -> list[str]:
    """The stress sample and random runs of every kind of piece."""
    pieces = [*WORDS, *WHITESPACE, *added, *RARE, "'s", "'LL", "1234", "e\u0301"]
    texts = ["".join(rng.choice(pieces) for _ in range(rng.randrange(0, 25))) for _ in range(150)]
    return stress_texts(added) + texts


@pytest.mark.parametrize("case", range(CASES))
def test_random_tokenizers_give_the_seed_s_ids_on_adversarial_texts(shared_seed, tmp_path, case):
    rng = random.Random(case)
    added, extra = random_tokenizer(rng, tmp_path)
    flags = ["--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", str(tmp_path)]
    flags += extra
    texts = adversarial_texts(rng, added)
    theirs = shared_seed.call("seed_tokenizers:tokenize", flags, texts)
    # the seed's tokenize gives None for an added token the config also declares special where
    # transformers cannot map it back to an id: its tool fails on such a text, so there is
    # nothing to equal
    kept = [n for n, ids in enumerate(theirs) if None not in ids]
    texts, theirs = [texts[n] for n in kept], [theirs[n] for n in kept]
    for backend in ("auto", "reference"):
        tokenizer = load([*flags, "--tokenizer-backend", backend])
        mine = tokenizer.encode_batch(texts)
        wrong = [(t, m, s) for t, m, s in zip(texts, mine, theirs, strict=True) if m != s]
        assert not wrong, (backend, tokenizer.backend_choice, flags, wrong[:3])

"""``mega preprocess`` against megatron-core 0.16.1's tokenizers (``compat="0.16.1"``), byte for
byte with Megatron-LM's tools/preprocess_data.py steps (the seed commit's own tool is run in
test_tokenizer_seed_compat.py).

The tool's steps are run by the harness in tools/compat/megatron_preprocess.py (megatron-core's
wheel does not ship the tool itself): megatron-core's tokenizer from the same flags, its
builder, lines dealt into partitions and merged as the tool does.
"""

import base64
import dataclasses
import io
import json
import random
import sys
import types
from pathlib import Path

import pytest
from megatron.core.tokenizers.text.utils.build_tokenizer import build_tokenizer

from megafmt.preprocess import PreprocessConfig, preprocess
from megafmt.tokenizers import TokenizerOptions
from megafmt.tokenizers.base import CORE_0_16

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools" / "compat"))
from megatron_preprocess import megatron_tool, tokenizer_args

WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "a",
    "lazy",
    "dog",
    "ünïcödé",
    "東京",
    "🙂",
    "data",
    "tokens",
    ",",
    ".",
    "!",
]


def assert_same_files(ours, theirs):
    for suffix in (".bin", ".idx"):
        with open(ours + suffix, "rb") as a, open(theirs + suffix, "rb") as b:
            assert a.read() == b.read(), f"{ours}{suffix} differs from {theirs}{suffix}"


def compare(
    tmp_path,
    lines,
    tokenizer_type,
    options,
    json_keys=("text",),
    append_eod=False,
    workers=1,
    partitions=1,
    keep_sequential_samples=False,
    chunk_bytes=4096,
    reference_tokenizer=None,
):
    """Our output and the tool's for ``lines``; the tool builds its tokenizer from the same
    flags with megatron-core's ``build_tokenizer`` unless ``reference_tokenizer`` is given."""
    source = tmp_path / "input.jsonl"
    source.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    options = dataclasses.replace(options, compat=CORE_0_16)  # this release's defaults
    if reference_tokenizer is None:
        reference_tokenizer = build_tokenizer(tokenizer_args(tokenizer_type, options))
    theirs = megatron_tool(
        reference_tokenizer,
        lines,
        str(tmp_path / "megatron" / "out"),
        json_keys,
        append_eod,
        partitions,
        keep_sequential_samples,
    )
    summary = preprocess(
        PreprocessConfig(
            input=str(source),
            output_prefix=str(tmp_path / "ours" / "out"),
            tokenizer_type=tokenizer_type,
            tokenizer_options=options,
            json_keys=tuple(json_keys),
            append_eod=append_eod,
            workers=workers,
            partitions=partitions,
            keep_sequential_samples=keep_sequential_samples,
            chunk_bytes=chunk_bytes,
        )
    )
    for key in json_keys:
        assert_same_files(summary.outputs[key], theirs[key])
    return summary


def random_text(rng, words=(0, 40)):
    return " ".join(rng.choice(WORDS) for _ in range(rng.randrange(*words)))


def text_lines(count=300, seed=0):
    """jsonl lines with two text keys; some texts empty, some given as lists of sentences."""
    rng = random.Random(seed)
    lines = []
    for number in range(count):
        body = random_text(rng) if number % 11 else ""
        if number % 7 == 3:
            body = [random_text(rng, (0, 8)) for _ in range(rng.randrange(1, 4))]
        lines.append(json.dumps({"text": body, "title": random_text(rng, (1, 6))}))
    return lines


@pytest.mark.parametrize("append_eod", [False, True])
@pytest.mark.parametrize(
    ("workers", "partitions", "sequential"),
    [(1, 1, False), (2, 1, False), (2, 3, False), (1, 4, True)],
)
def test_null_tokenizer(tmp_path, append_eod, workers, partitions, sequential):
    rng = random.Random(partitions)
    lines = [
        json.dumps(
            {
                "text": " ".join(str(rng.randrange(1000)) for _ in range(rng.randrange(1, 30))),
                "meta": str(rng.randrange(1000)),
            }
        )
        for _ in range(200)
    ]
    compare(
        tmp_path,
        lines,
        "NullTokenizer",
        TokenizerOptions(vocab_size=1000),
        ("text", "meta"),
        append_eod,
        workers,
        partitions,
        sequential,
    )


def test_null_tokenizer_with_a_large_vocabulary_writes_int32(tmp_path):
    lines = [json.dumps({"text": f"{i * 1000} 1 2"}) for i in range(100)]
    compare(tmp_path, lines, "NullTokenizer", TokenizerOptions(vocab_size=200_000), append_eod=True)


@pytest.fixture(scope="module")
def hf_tokenizer_dir(tmp_path_factory):
    """A byte-level BPE trained here in a second, saved as tokenizer.json with an eos token."""
    tokenizers = pytest.importorskip("tokenizers")
    tokenizer = tokenizers.Tokenizer(tokenizers.models.BPE())
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
    )
    rng = random.Random(1)
    tokenizer.train_from_iterator([random_text(rng) for _ in range(3000)], trainer)
    directory = tmp_path_factory.mktemp("hf")
    tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>"})
    )
    tokenizer.model.save(str(directory))  # vocab.json and merges.txt, for GPT2BPETokenizer
    return directory


@pytest.mark.parametrize("append_eod", [False, True])
@pytest.mark.parametrize(("workers", "partitions"), [(1, 1), (2, 2)])
def test_huggingface_tokenizer_json(tmp_path, hf_tokenizer_dir, append_eod, workers, partitions):
    pytest.importorskip("transformers")
    compare(
        tmp_path,
        text_lines(),
        "HuggingFaceTokenizer",
        TokenizerOptions(model=str(hf_tokenizer_dir)),
        ("text", "title"),
        append_eod,
        workers,
        partitions,
    )


def test_gpt2_bpe_vocab_and_merges(tmp_path, hf_tokenizer_dir):
    """megatron-core's GPT2BPETokenizer asks the Hub for the "gpt2" configuration before it
    reads the local vocab and merges; offline, the reference is the same HuggingFaceTokenizer
    over a folder that names GPT2Tokenizer (what "gpt2" resolves to) beside those two files."""
    pytest.importorskip("transformers")
    from megatron.core.tokenizers.text.libraries.huggingface_tokenizer import (
        HuggingFaceTokenizer,
    )

    gpt2 = tmp_path / "gpt2"
    gpt2.mkdir()
    for name in ("vocab.json", "merges.txt"):
        (gpt2 / name).write_bytes((hf_tokenizer_dir / name).read_bytes())
    (gpt2 / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "GPT2Tokenizer"}))
    library = HuggingFaceTokenizer(str(gpt2))
    reference_tokenizer = types.SimpleNamespace(
        tokenize=library.text_to_ids, eod=library.eod, vocab_size=library.vocab_size
    )
    options = TokenizerOptions(
        vocab_file=str(hf_tokenizer_dir / "vocab.json"),
        merge_file=str(hf_tokenizer_dir / "merges.txt"),
    )
    compare(
        tmp_path,
        text_lines(seed=2),
        "GPT2BPETokenizer",
        options,
        append_eod=True,
        workers=2,
        reference_tokenizer=reference_tokenizer,
    )


def test_tiktoken_vocabulary(tmp_path):
    pytest.importorskip("tiktoken")
    rng = random.Random(3)
    sample = " ".join(random_text(rng) for _ in range(200)).encode()
    pieces = sorted({sample[i : i + n] for n in (2, 3, 4) for i in range(0, len(sample) - n, 7)})
    ranks = [bytes([b]) for b in range(256)] + [p for p in pieces if len(p) > 1][:500]
    vocab = tmp_path / "vocab.json"
    vocab.write_text(
        json.dumps(
            [
                {"rank": i, "token_bytes": base64.b64encode(t).decode(), "token_str": ""}
                for i, t in enumerate(ranks)
            ]
        )
    )
    options = TokenizerOptions(
        model=str(vocab), vocab_size=len(ranks) + 16, tiktoken_num_special_tokens=16
    )
    summary = compare(
        tmp_path, text_lines(seed=3), "TikTokenizer", options, append_eod=True, workers=2
    )
    # the same ranks as a plain .tiktoken file (base64 token, rank) give the same corpus
    plain = tmp_path / "vocab.tiktoken"
    plain.write_text("".join(f"{base64.b64encode(t).decode()} {i}\n" for i, t in enumerate(ranks)))
    again = preprocess(
        PreprocessConfig(
            input=str(tmp_path / "input.jsonl"),
            output_prefix=str(tmp_path / "plain" / "out"),
            tokenizer_type="tiktoken",
            tokenizer_options=dataclasses.replace(options, model=str(plain)),
            append_eod=True,
        )
    )
    assert_same_files(again.outputs["text"], summary.outputs["text"])


def test_sentencepiece_model(tmp_path):
    sentencepiece = pytest.importorskip("sentencepiece")
    rng = random.Random(4)
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter([random_text(rng, (3, 20)) for _ in range(2000)]),
        model_writer=model,
        vocab_size=50,
        character_coverage=1.0,
    )
    path = tmp_path / "sp.model"
    path.write_bytes(model.getvalue())
    compare(
        tmp_path,
        text_lines(seed=4),
        "SentencePieceTokenizer",
        TokenizerOptions(model=str(path)),
        append_eod=True,
        workers=2,
    )


def test_identity_with_compat_0_16_1_equals_megatron_core_s(tmp_path, hf_tokenizer_dir):
    """``compat="0.16.1"``: the identifiers megatron-core 0.16.1's build_tokenizer reports."""
    from megafmt.tokenizers.identity import megatron_identifiers

    cases = [
        ("NullTokenizer", TokenizerOptions(vocab_size=1000)),
        ("HuggingFaceTokenizer", TokenizerOptions(model=str(hf_tokenizer_dir))),
        ("HuggingFaceTokenizer",
         TokenizerOptions(model=str(hf_tokenizer_dir), include_special_tokens=True,
                          use_fast=True, special_tokens=("<x>",))),
    ]  # fmt: skip
    for tokenizer_type, options in cases:
        options = dataclasses.replace(options, compat=CORE_0_16)
        theirs = build_tokenizer(tokenizer_args(tokenizer_type, options)).unique_identifiers
        assert megatron_identifiers(tokenizer_type, options) == theirs, tokenizer_type

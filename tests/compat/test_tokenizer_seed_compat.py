"""The tokenizers and tools/preprocess_data.py of Megatron-LM at the seed commit, run as the
reference, against megafmt's tokenizer plugins, ``mega preprocess`` and ``mega index build``.

For each tokenizer type (null, HuggingFace tokenizer.json, GPT2BPE vocab/merges, tiktoken,
sentencepiece; SFT for the identity) the test files are made here: a byte-level BPE trained with
``tokenizers``, a sentencepiece model trained with ``sentencepiece``, a tiktoken vocabulary of
byte pairs. The same command line goes to the seed's parser and to ours:

- the tokenizer's identity (``unique_identifiers`` in order, EOD, vocabulary size, pad);
- the seed's tools/preprocess_data.py and ``mega preprocess`` on the same jsonl (hand-picked
  documents beside seeded random ones: unicode, empty, long), compared byte for byte;
- GPTDataset's cache built by one side is the other side's cache (the same hashed names, and
  nothing new written when the other side opens it).

The seed's GPT2BPETokenizer asks the Hugging Face Hub for "gpt2" (the configuration, the
merges) before reading ``--vocab-file``: its worker runs offline on a Hub cache made here whose
"gpt2" holds the same vocab.json and merges.txt (``HF_HUB_OFFLINE``, ``HF_HOME``).
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import os
import random
from pathlib import Path

import pytest
from seedref import SeedProcess

from megafmt.cli.main import main
from megafmt.cli.tokenizer_flags import add_tokenizer_arguments, tokenizer_options
from megafmt.sft.testing import write_sft_tokenizer
from megafmt.tokenizers import TokenizerOptions, load_tokenizer
from megafmt.tokenizers.base import ArrayTokenizer
from megafmt.tokenizers.identity import megatron_identifiers
from megaindex.tokenizer import IdentifiedTokenizer

pytestmark = pytest.mark.compat

SEEDSIDE = Path(__file__).parent / "seedside"
WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "data", "tokens",
         "ünïcödé", "東京", "🙂", "naïve", "Ωμέγα", ",", ".", "!", "\n", "\t", "  "]  # fmt: skip
#: documents that caught tokenizers out before: whitespace runs, specials in the text, marks
HAND_PICKED = ["", " ", "  leading and trailing  ", "a\n\nb", "x  y   z", "</s> <s> <pad>",
               "<|endoftext|>", "ﬁ ligature, NFKC ①", "\u200b zero width", "🙂" * 30]  # fmt: skip


def random_documents(seed: int, count: int) -> list[str]:
    """Seeded random texts: words of several scripts, empty ones, a few long ones."""
    rng = random.Random(seed)
    documents = []
    for number in range(count):
        length = 0 if number % 13 == 5 else rng.choice([rng.randrange(1, 30), 700])
        documents.append(" ".join(rng.choice(WORDS) for _ in range(length)))
    return documents


def null_documents(seed: int, count: int, vocab: int) -> list[str]:
    rng = random.Random(seed)
    lengths = [rng.choice([1, rng.randrange(1, 40), 1000]) for _ in range(count)]
    return [" ".join(str(rng.randrange(vocab)) for _ in range(n)) for n in lengths]


def save_tokenizer(folder: Path, tokenizer, **config) -> None:
    """tokenizer.json and a tokenizer_config.json declaring ``config`` in ``folder``."""
    tokenizer.save(str(folder / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", **config}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    """The tokenizer files of every type, made here."""
    tokenizers = pytest.importorskip("tokenizers")
    sentencepiece = pytest.importorskip("sentencepiece")
    root = tmp_path_factory.mktemp("tokenizers")
    texts = random_documents(1, 600)
    # a byte-level BPE whose tokenizer.json adds a BOS: what "include special tokens" changes
    bpe = tokenizers.Tokenizer(tokenizers.models.BPE())
    bpe.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=500,
        special_tokens=["<|endoftext|>", "<s>"],
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
    )
    bpe.train_from_iterator(texts, trainer)
    hf = root / "hf"
    hf.mkdir()
    bpe.model.save(str(hf))  # vocab.json and merges.txt: the GPT2BPE files
    bpe.post_processor = tokenizers.processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", bpe.token_to_id("<s>"))]
    )
    save_tokenizer(hf, bpe, eos_token="<|endoftext|>", bos_token="<s>")
    # the same model, no post-processor, a config declaring a word of the vocabulary as its bos
    # and tokens it lacks: transformers makes them all special (the new ones get new ids)
    declared = root / "hf-declared"
    declared.mkdir()
    bpe.post_processor = None
    save_tokenizer(
        declared,
        bpe,
        eos_token="<|endoftext|>",
        bos_token="the",
        pad_token="<pad>",
        additional_special_tokens=["<extra>", "fox"],
    )
    # the Hub cache the seed's GPT2BPETokenizer reads "gpt2" from, offline
    snapshot = root / "hub-home" / "hub" / "models--gpt2" / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    for name in ("vocab.json", "merges.txt"):
        (snapshot / name).write_bytes((hf / name).read_bytes())
    (snapshot / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "GPT2Tokenizer", "model_max_length": 1024})
    )
    (snapshot / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    refs = snapshot.parent.parent / "refs"
    refs.mkdir()
    (refs / "main").write_text("0" * 40)
    # sentencepiece: a unigram model of 120 pieces (it collapses runs of spaces)
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter([text for text in texts if 0 < len(text) < 400]),
        model_writer=model,
        vocab_size=60,
        character_coverage=1.0,
        pad_id=3,
        minloglevel=2,
    )
    (root / "sp.model").write_bytes(model.getvalue())
    # tiktoken: the 256 bytes, then byte pairs and triples of the texts, in Megatron's JSON
    sample = " ".join(texts[:200]).encode()
    pieces = sorted({sample[i : i + n] for n in (2, 3) for i in range(0, len(sample) - n, 5)})
    ranks = [bytes([b]) for b in range(256)] + pieces[:700]
    vocab = [
        {"rank": i, "token_bytes": base64.b64encode(t).decode(), "token_str": ""}
        for i, t in enumerate(ranks)
    ]
    (root / "tiktoken.json").write_text(json.dumps(vocab))
    (root / "metadata.json").write_text(json.dumps({"library": "huggingface", "model_type": "gpt"}))
    sft = root / "sft"
    sft.mkdir()
    write_sft_tokenizer(sft)
    return {
        "hf": str(hf),
        "hf_declared": str(declared),
        "hub_home": str(root / "hub-home"),
        "sp": str(root / "sp.model"),
        "tiktoken": str(root / "tiktoken.json"),
        "metadata": str(root / "metadata.json"),
        "sft": str(sft),
        "tiktoken_size": str(len(ranks) + 1000),
    }


@pytest.fixture(scope="module")
def seed_tok(files):
    """A seed worker with the offline Hub cache (its GPT2BPETokenizer needs "gpt2")."""
    env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HOME": files["hub_home"]}
    with SeedProcess(paths=[SEEDSIDE], env=env) as process:
        yield process


def flag_sets(files: dict[str, str]) -> dict[str, list[list[str]]]:
    """Per tokenizer type, the command lines compared (the first is the type's plain one)."""
    hf, sp, tik = files["hf"], files["sp"], files["tiktoken"]
    gpt2 = [
        "--tokenizer-type",
        "GPT2BPETokenizer",
        "--vocab-file",
        f"{hf}/vocab.json",
        "--merge-file",
        f"{hf}/merges.txt",
    ]
    tiktoken = ["--tokenizer-type", "TikTokenizer", "--tokenizer-model", tik]
    return {
        "null": [
            ["--tokenizer-type", "NullTokenizer", "--vocab-size", "1000"],
            ["--tokenizer-type", "NullTokenizer", "--vocab-size", "70000"],
            [
                "--tokenizer-type",
                "NullTokenizer",
                "--vocab-size",
                "1000",
                "--null-tokenizer-eod-id",
                "0",
                "--null-tokenizer-pad-id",
                "998",
            ],
        ],
        "huggingface": [
            ["--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", hf],
            [
                "--tokenizer-type",
                "HuggingFaceTokenizer",
                "--tokenizer-model",
                hf,
                "--tokenizer-hf-no-include-special-tokens",
                "--tokenizer-hf-no-use-fast",
                "--chat-template",
                "{{ messages }}",
                "--trust-remote-code",
            ],
            [
                "--tokenizer-type",
                "HuggingFaceTokenizer",
                "--tokenizer-model",
                hf,
                "--tokenizer-special-tokens",
                "<new_a>",
                "<s>",
                "--tokenizer-metadata",
                files["metadata"],
            ],
            [
                "--tokenizer-type",
                "HuggingFaceTokenizer",
                "--tokenizer-model",
                files["hf_declared"],
                "--tokenizer-special-tokens",
                "<pad>",
                "dog",
            ],
        ],
        "gpt2": [gpt2, [*gpt2, "--tokenizer-hf-no-include-special-tokens"]],
        "tiktoken": [
            [*tiktoken, "--vocab-size", files["tiktoken_size"]],
            [
                *tiktoken,
                "--vocab-size",
                str(int(files["tiktoken_size"]) - 100),
                "--tiktoken-pattern",
                "v1",
                "--tiktoken-num-special-tokens",
                "1000",
            ],
        ],
        "sentencepiece": [
            ["--tokenizer-type", "SentencePieceTokenizer", "--tokenizer-model", sp],
            [
                "--tokenizer-type",
                "GPTSentencePieceTokenizer",
                "--tokenizer-model",
                sp,
                "--no-tokenizer-sentencepiece-ignore-extra-whitespaces",
            ],
            [
                "--tokenizer-type",
                "Llama2Tokenizer",
                "--tokenizer-model",
                sp,
                "--chat-template",
                "x",
            ],
            [
                "--tokenizer-type",
                "SentencePieceTokenizer",
                "--tokenizer-model",
                sp,
                "--tokenizer-sentencepiece-legacy",
                "--tokenizer-special-tokens",
                "<new>",
                "</s>",
                "fox",
                "<s>",
                "🙂🙂",
            ],
        ],
    }


def parsed(flags: list[str]) -> tuple[str, TokenizerOptions]:
    """Our parser's tokenizer type and options for ``flags``."""
    parser = argparse.ArgumentParser()
    add_tokenizer_arguments(parser, None, "")
    args = parser.parse_args(flags)
    return args.tokenizer_type, tokenizer_options(args)


def ours(flags: list[str]) -> IdentifiedTokenizer:
    return IdentifiedTokenizer.from_flags(*parsed(flags))


TYPES = ["null", "huggingface", "gpt2", "tiktoken", "sentencepiece"]


@pytest.mark.parametrize("kind", TYPES)
def test_identity_equals_the_seed_s(seed_tok, files, kind):
    for flags in flag_sets(files)[kind]:
        theirs = seed_tok.call("seed_tokenizers:identity", flags)
        if "--tokenizer-sentencepiece-legacy" in flags:
            # Megatron's legacy wrapper has no EOD (a dataset cannot use it): the identity
            # and the vocabulary its special tokens grow
            identifiers = megatron_identifiers(*parsed(flags))
            assert list(identifiers.items()) == theirs["identifiers"]
            plugin = load_tokenizer(*parsed(flags))
            assert (plugin.eod, plugin.vocab_size) == (theirs["eod"], theirs["vocab_size"])
            continue
        mine = ours(flags)
        assert list(mine.unique_identifiers.items()) == theirs["identifiers"], flags
        assert (mine.eod, mine.vocab_size) == (theirs["eod"], theirs["vocab_size"]), flags
        assert getattr(mine, "pad", None) == theirs["pad"], flags


def test_sft_identity_equals_the_seed_s(seed_tok, files):
    from megafmt.sft import SFTTokenizer

    for prompt_format in ("nemotron-h-aligned", "identity"):
        flags = ["--tokenizer-type", "SFTTokenizer", "--tokenizer-model", files["sft"]]
        theirs = seed_tok.call("seed_tokenizers:identity", flags, prompt_format)
        mine = SFTTokenizer(files["sft"], prompt_format)
        assert list(mine.unique_identifiers.items()) == theirs["identifiers"]
        assert (mine.eod, mine.vocab_size) == (theirs["eod"], theirs["vocab_size"])


def write_jsonl(path: Path, kind: str, seed: int) -> None:
    if kind == "null":
        texts = null_documents(seed, 100, 1000)
        titles = null_documents(seed + 1, 100, 1000)
    else:
        texts = HAND_PICKED + random_documents(seed, 100)
        titles = random_documents(seed + 1, len(texts))
    with open(path, "w", encoding="utf-8") as stream:
        for text, title in zip(texts, titles, strict=True):
            stream.write(json.dumps({"text": text, "title": title}) + "\n")


#: the command lines of flag_sets run through both tools: those that change the ids
PREPROCESSED = {"null": [1, 2], "huggingface": [0, 1, 2, 3], "gpt2": [0], "tiktoken": [1],
                "sentencepiece": [0, 1, 3]}  # fmt: skip


@pytest.mark.parametrize("kind", TYPES)
def test_mega_preprocess_writes_the_seed_tool_s_bytes(seed_tok, files, tmp_path, kind):
    for number in PREPROCESSED[kind]:
        flags = flag_sets(files)[kind][number]
        source = tmp_path / f"input-{number}.jsonl"
        write_jsonl(source, kind, number)
        common = ["--input", str(source), "--json-keys", "text", "title", "--workers", "1",
                  *flags, *(["--append-eod"] if number % 2 == 0 else [])]  # fmt: skip
        theirs, mine = str(tmp_path / f"seed-{number}"), str(tmp_path / f"ours-{number}")
        seed_tok.call("seed_tokenizers:preprocess_data", [*common, "--output-prefix", theirs])
        assert main(["preprocess", *common, "--output-prefix", mine, "--workers", "2"]) == 0
        for key in ("text", "title"):
            for suffix in (".bin", ".idx"):
                name = f"_{key}_document{suffix}"
                assert Path(mine + name).read_bytes() == Path(theirs + name).read_bytes(), (
                    flags,
                    name,
                )


def test_mega_preprocess_with_partitions_writes_the_seed_tool_s_bytes(seed_tok, files, tmp_path):
    """Partitions (round-robin and sequential) and the tool's --find-optimal-num-workers, whose
    report names the fastest count; ours then preprocesses everything."""
    source = tmp_path / "input.jsonl"
    write_jsonl(source, "huggingface", 7)
    flags = flag_sets(files)["huggingface"][0]
    for extra in (["--partitions", "2"], ["--partitions", "2", "--keep-sequential-samples"]):
        common = ["--input", str(source), "--workers", "2", "--append-eod", *flags, *extra]
        (tmp_path / "seed").mkdir(exist_ok=True)
        (tmp_path / "ours").mkdir(exist_ok=True)
        theirs, mine = str(tmp_path / "seed" / "out"), str(tmp_path / "ours" / "out")
        seed_tok.call("seed_tokenizers:preprocess_data", [*common, "--output-prefix", theirs])
        assert main(["preprocess", *common, "--output-prefix", mine]) == 0
        for suffix in (".bin", ".idx"):
            name = f"_text_document{suffix}"
            assert Path(mine + name).read_bytes() == Path(theirs + name).read_bytes(), extra
        for leftover in tmp_path.glob("input_*"):
            os.remove(leftover)  # the tool's partition files, beside its input


def cache_files(folder: Path) -> dict[str, int]:
    """Megatron's cache files (the description and the three tables) and their times; the
    sidecar megaindex writes beside them is not Megatron's."""
    return {
        str(p.relative_to(folder)): p.stat().st_mtime_ns
        for p in folder.rglob("*")
        if p.name.endswith(("-description.txt", "_index.npy"))
    }


#: a model small enough for tools/prepare_cache.py (it reads Megatron's whole argument list)
MODEL = ["--num-layers", "1", "--hidden-size", "8", "--num-attention-heads", "1",
         "--max-position-embeddings", "32", "--micro-batch-size", "2"]  # fmt: skip


@pytest.mark.parametrize("kind", TYPES)
def test_a_cache_built_by_one_side_is_hit_by_the_other(seed_tok, files, tmp_path, kind):
    """The seed's tools/prepare_cache.py and mega index build, with the same flags."""
    flags = flag_sets(files)[kind][0]
    source = tmp_path / "input.jsonl"
    write_jsonl(source, kind, 11)
    prefix = str(tmp_path / "corpus")
    assert main(["preprocess", "--input", str(source), "--output-prefix", prefix,
                 "--append-eod", "--workers", "1", *flags]) == 0  # fmt: skip
    common = ["--data-path", f"{prefix}_text_document", "--split", "90,6,4", "--seq-length",
              "32", "--seed", "7", "--train-iters", "15", "--global-batch-size", "4",
              "--eval-iters", "2", "--eval-interval", "5", *flags]  # fmt: skip
    # the seed builds, mega index build opens it: nothing new is written
    theirs = tmp_path / "seed-built"
    seed_tok.call(
        "seed_tokenizers:prepare_cache", [*MODEL, *common, "--data-cache-path", str(theirs)]
    )
    before = cache_files(theirs)
    assert len(before) == 12  # the description and three tables of each split
    assert main(["index", "build", *common, "--cache-dir", str(theirs)]) == 0
    assert cache_files(theirs) == before
    # mega index build builds, the seed opens it: the same names, nothing new written
    mine = tmp_path / "ours-built"
    assert main(["index", "build", *common, "--cache-dir", str(mine)]) == 0
    built = cache_files(mine)
    assert sorted(built) == sorted(before)
    seed_tok.call(
        "seed_tokenizers:prepare_cache", [*MODEL, *common, "--data-cache-path", str(mine)]
    )
    assert cache_files(mine) == built


def test_tiktoken_ids_equal_the_seed_s_with_and_without_special_tokens_in_the_text(seed_tok, files):
    """Ours skips the search for special tokens in a text that lacks the character all of them
    hold; seeded texts of words, brackets, whole and broken special tokens take both paths."""
    rng = random.Random(17)
    marked = [*WORDS, "<", ">", "<s>", "</s", "<pad>", "<SPECIAL_7>", "<SPECIAL_",
              "<|endoftext|>", "|>", "<<>>", "s>", "<unk>"]  # fmt: skip
    texts = []
    for _ in range(300):
        pieces = marked if rng.random() < 0.5 else [*WORDS, ">", "|>", "s>"]
        words = (rng.choice(pieces) for _ in range(rng.randrange(0, 40)))
        texts.append(rng.choice(["", " "]).join(words))
    with_mark = sum("<" in text for text in texts)
    assert 50 < with_mark < 250  # both paths taken often
    texts += ["caf\ud83d x", "\udc00", "<s>\ud83d"]  # lone surrogates: mended as Megatron does
    for flags in flag_sets(files)["tiktoken"]:
        tokenizer = load_tokenizer(*parsed(flags))
        theirs = seed_tok.call("seed_tokenizers:tokenize", flags, texts)
        assert tokenizer.encode_batch(texts) == theirs, flags
        # preprocessing takes them as arrays, straight from the library's buffer
        assert isinstance(tokenizer, ArrayTokenizer)
        arrays = tokenizer.encode_batch_arrays(texts)
        assert all(ids.ndim == 1 and ids.dtype.kind in "iu" for ids in arrays)
        assert [ids.tolist() for ids in arrays] == theirs, flags

"""``mega index explain --dataset fim --tokens`` shows a FIM sample, ids and decoded text with
its sentinels; ``mega dump --tokenizer-model`` decodes a document, special tokens as written."""

from __future__ import annotations

import json
import random

import pytest
from fimtesting import FILE_SEP, FIM_EXTRA_TOKENS, code_text, write_code_corpus, write_tokenizer

import megaindex
from megafmt.cli.main import main
from megafmt.tokenizers import TokenizerOptions, load_text_tokenizer
from megaindex.tokenizer import IdentifiedTokenizer

IDENTIFIERS = {"class": "test.fim.cli"}


@pytest.fixture(scope="module")
def code(tmp_path_factory):
    """A tokenizer folder and a corpus of 200 code-like documents."""
    pytest.importorskip("tokenizers")
    directory = tmp_path_factory.mktemp("fim-cli")
    rng = random.Random(2)
    tokenizer_dir = write_tokenizer(
        directory / "tokenizer", 400, [code_text(rng, 30) for _ in range(500)]
    )
    text = load_text_tokenizer("huggingface", TokenizerOptions(model=tokenizer_dir))
    prefix = str(directory / "code")
    texts = [FILE_SEP.join(code_text(rng, 20) for _ in range(2)) for _ in range(200)]
    write_code_corpus(prefix, text, texts)
    return tokenizer_dir, prefix, text


def explain_args(code, tmp_path, *extra):
    tokenizer_dir, prefix, text = code
    return [
        "index",
        "explain",
        "--dataset",
        "fim",
        "--data-path",
        prefix,
        "--split",
        "100,0,0",
        "--seq-length",
        "48",
        "--samples",
        "300,0,0",
        "--tokenizer-identifiers",
        json.dumps(IDENTIFIERS),
        "--eod",
        str(text.eod),
        "--tokenizer-model",
        tokenizer_dir,
        "--cache-dir",
        str(tmp_path / "cache"),
        "--fim-rate",
        "1",
        *extra,
    ]


@pytest.mark.parametrize(
    "extra", [[], ["--fim-split-sample", FILE_SEP, "--fim-fragment-rate", "1"]]
)
def test_explain_shows_the_rearranged_sample_decoded(code, tmp_path, capsys, extra):
    _, prefix, text = code
    assert main([*explain_args(code, tmp_path, *extra), "--sample", "7", "--tokens"]) == 0
    lines = capsys.readouterr().out.splitlines()
    ids_line = lines.index("decoded (special tokens as written):") - 1
    config = megaindex.GPTFIMDatasetConfig(
        random_seed=1234,
        sequence_length=48,
        blend=([prefix], None),
        split="100,0,0",
        tokenizer=IdentifiedTokenizer(text.eod, text.vocab_size, IDENTIFIERS, text=text),
        path_to_cache=str(tmp_path / "cache"),
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
        fim_rate=1.0,
        fim_spm_rate=0.5,
        fim_extra_tokens=FIM_EXTRA_TOKENS,
        fim_split_sample=FILE_SEP if extra else None,
        fim_fragment_rate=1.0 if extra else None,
    )
    dataset = megaindex.BlendedMegatronDatasetBuilder(
        megaindex.GPTFIMDataset, [300, 0, 0], lambda: True, config
    ).build()[0]
    shaped, _ = dataset._query_document_sample_shuffle_indices(7)  # a fresh dataset's first read
    assert lines[ids_line] == " ".join(map(str, shaped.tolist()))
    decoded = "\n".join(lines[ids_line + 2 :])
    assert decoded == text.ids_to_text(shaped, remove_special_tokens=False)
    assert decoded.startswith("<fim_prefix>") or f"{FILE_SEP}<fim_prefix>" in decoded
    assert "<fim_middle>" in decoded and "<fim_suffix>" in decoded


def test_fim_without_a_tokenizer_model_is_refused(code, tmp_path, capsys):
    args = explain_args(code, tmp_path)
    position = args.index("--tokenizer-model")
    del args[position : position + 2]
    assert main([*args, "--sample", "0"]) != 0
    assert "IdentifiedTokenizer without text" in capsys.readouterr().err


def test_dump_decodes_a_document(code, capsys):
    tokenizer_dir, prefix, text = code
    assert main(["dump", prefix, "--doc", "3", "--tokenizer-model", tokenizer_dir, "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    (ids,) = record["sequences"]
    (decoded,) = record["texts"]
    assert decoded == text.ids_to_text(ids, remove_special_tokens=False)
    assert decoded.endswith("<|endoftext|>") and FILE_SEP in decoded

"""The tokenizer plugins: names, Megatron aliases, files, EOD and clear errors."""

import json
import sys

import pytest

from megafmt.errors import MissingFileError, PluginError
from megafmt.tokenizers import MEGATRON_ALIASES, TOKENIZERS, TokenizerOptions, load_tokenizer


def test_built_in_plugins_and_megatron_aliases():
    assert {"bytes", "null", "huggingface", "tiktoken", "sentencepiece"} <= set(TOKENIZERS)
    assert set(MEGATRON_ALIASES.values()) <= set(TOKENIZERS)
    assert load_tokenizer("NullTokenizer", TokenizerOptions(vocab_size=7)).eod == 6
    with pytest.raises(PluginError, match=r"unknown tokenizer 'nul'.*did you mean 'null'"):
        load_tokenizer("nul", TokenizerOptions())


def test_bytes_and_null_encode_as_megatron_does():
    assert load_tokenizer("bytes", TokenizerOptions()).encode_batch(["aé", ""]) == [
        [97, 195, 169],
        [],
    ]
    null = load_tokenizer("null", TokenizerOptions(vocab_size=50))
    # the seed commit's: EOD vocab_size - 1, no pad; megatron-core 0.16.1's: EOD vocab_size
    assert (null.vocab_size, null.eod, null.pad) == (50, 49, -1)
    chosen = TokenizerOptions(vocab_size=50, null_eod_id=0, null_pad_id=7)
    assert (load_tokenizer("null", chosen).eod, load_tokenizer("null", chosen).pad) == (0, 7)
    old = load_tokenizer("null", TokenizerOptions(vocab_size=50, compat="0.16.1"))
    assert (old.vocab_size, old.eod) == (51, 50)
    with pytest.raises(PluginError, match="compat must be one of seed, 0.16.1, found '0.15'"):
        TokenizerOptions(compat="0.15")
    assert null.encode_batch(["3 1 4", "15"]) == [[3, 1, 4], [15]]
    with pytest.raises(ValueError, match="integers separated by single spaces, found ''"):
        null.encode_batch([""])


def trained_tokenizer_json(directory, special="<eos>"):
    tokenizers = pytest.importorskip("tokenizers")
    tokenizer = tokenizers.Tokenizer(tokenizers.models.BPE())
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=[special],
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(["hello world, hello tokens"] * 50, trainer)
    tokenizer.save(str(directory / "tokenizer.json"))
    return tokenizer


def test_huggingface_takes_the_eos_token_of_its_config(tmp_path):
    trained = trained_tokenizer_json(tmp_path)
    options = TokenizerOptions(model=str(tmp_path))
    assert load_tokenizer("huggingface", options).eod is None  # no config: no EOD
    config = {"eos_token": {"content": "<eos>", "special": True}}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    tokenizer = load_tokenizer("HuggingFaceTokenizer", options)
    assert tokenizer.eod == trained.token_to_id("<eos>") == 0
    assert tokenizer.vocab_size == trained.get_vocab_size()
    text = "hello world"
    assert tokenizer.encode_batch([text]) == [trained.encode(text, add_special_tokens=False).ids]
    same_file = load_tokenizer(
        "huggingface", TokenizerOptions(model=str(tmp_path / "tokenizer.json"))
    )
    assert same_file.fingerprint == tokenizer.fingerprint


def test_huggingface_errors_name_the_flag_and_path(tmp_path):
    pytest.importorskip("tokenizers")
    with pytest.raises(MissingFileError, match="the directory holds no tokenizer.json"):
        load_tokenizer("huggingface", TokenizerOptions(model=str(tmp_path)))
    with pytest.raises(MissingFileError, match=r"--tokenizer-model .*nope.json: file not found"):
        load_tokenizer("huggingface", TokenizerOptions(model=str(tmp_path / "nope.json")))
    with pytest.raises(PluginError, match="needs --tokenizer-model"):
        load_tokenizer("huggingface", TokenizerOptions())
    (tmp_path / "broken.json").write_text("{}")
    with pytest.raises(ValueError, match="broken.json: not a tokenizers tokenizer.json"):
        load_tokenizer("huggingface", TokenizerOptions(model=str(tmp_path / "broken.json")))


@pytest.mark.parametrize(
    ("name", "package"), [("tiktoken", "tiktoken"), ("sentencepiece", "sentencepiece")]
)
def test_a_missing_library_is_named(tmp_path, monkeypatch, name, package):
    monkeypatch.setitem(sys.modules, package, None)  # import fails as if not installed
    model = tmp_path / "model"
    model.write_text("")
    with pytest.raises(PluginError, match=f"needs the '{package}' package: pip install {package}"):
        load_tokenizer(name, TokenizerOptions(model=str(model)))


def test_a_plugin_missing_a_protocol_member_is_a_plugin_error_naming_it(monkeypatch):
    class NoPad:
        name, vocab_size, eod, fingerprint = "nopad", 10, 9, "sha256:0"

        @classmethod
        def from_options(cls, options):
            return cls()

        def encode_batch(self, texts):
            return [[1] for _ in texts]

    monkeypatch.setattr(TOKENIZERS, "get", lambda name: NoPad)
    with pytest.raises(PluginError, match=r"the nopad tokenizer plugin built a .*NoPad.*lacks pad"):
        load_tokenizer("nopad", TokenizerOptions())

"""What a run builds once in its main process: the encoder its forked workers inherit instead of
loading the tokenizer again, and, with one worker on the block path, the encoding itself (no
pool at all). Either way the bytes, the counts, the bad lines named and the cleanup of an
interrupted run are those of a run on a pool."""

import importlib
import json
import multiprocessing
import os
import random
import signal
from pathlib import Path

import pytest

from megafmt.errors import BadInputError
from megafmt.preprocess import PreprocessConfig, encoding, pipeline, preprocess
from megafmt.preprocess.encoding import (
    Encoder,
    EncodeSettings,
    prebuilt_for_fork,
    start_worker,
)
from megafmt.tokenizers import TOKENIZERS, TokenizerOptions
from megafmt.tokenizers.simple import BytesTokenizer

tokenizers = pytest.importorskip("tokenizers")
pytest.importorskip("gigatoken")
pytest.importorskip("pyarrow")

needs_fork = pytest.mark.skipif(
    "fork" not in multiprocessing.get_all_start_methods(), reason="no fork here"
)

WORDS = ["the", "fox", "don't", "ünïcödé", "東京", "🙂", " ", "\n"]
EOS = "<|endoftext|>"
CONFIG = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": EOS}
#: the process that imported this module: the one that runs the tests
MAIN = os.getpid()


class MainOnlyTokenizer(BytesTokenizer):
    """The bytes tokenizer, which refuses to load anywhere but in the tests' process: a worker
    that loads its own fails its start."""

    @classmethod
    def from_options(cls, options: TokenizerOptions) -> BytesTokenizer:
        if os.getpid() != MAIN:
            raise RuntimeError(f"the tokenizer was loaded again in process {os.getpid()}")
        return cls()


@pytest.fixture
def main_only():
    TOKENIZERS.register("main-only", MainOnlyTokenizer)
    yield "main-only"
    TOKENIZERS.unregister("main-only")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """A byte-level tokenizer.json without merges (one id per byte) and an EOS: gigatoken's
    self-check passes on it, so runs with it take the block path."""
    alphabet = sorted(tokenizers.pre_tokenizers.ByteLevel.alphabet())
    bpe = tokenizers.models.BPE({c: i for i, c in enumerate(alphabet)}, [])
    tokenizer = tokenizers.Tokenizer(bpe)
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.add_special_tokens([EOS])
    folder = tmp_path_factory.mktemp("bytes")
    files = {"tokenizer.json": tokenizer.to_str(), "tokenizer_config.json": json.dumps(CONFIG)}
    for name, content in files.items():
        (folder / name).write_text(content)
    return str(folder)


def text(rng: random.Random) -> str:
    return "".join(rng.choice(WORDS) for _ in range(rng.randrange(0, 30)))


def corpus(path: Path, seed: int, bad: bytes | None = None) -> Path:
    """300 seeded documents as jsonl; ``bad`` replaces line 120."""
    rng = random.Random(seed)
    lines = [json.dumps({"text": text(rng)}).encode() for _ in range(300)]
    if bad is not None:
        lines[119] = bad
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def config_for(source: Path, prefix: Path, model: str, **flags) -> PreprocessConfig:
    return PreprocessConfig(
        str(source),
        str(prefix),
        "HuggingFaceTokenizer",
        TokenizerOptions(model=model),
        append_eod=True,
        chunk_bytes=1000,
        log_interval=10**9,
        **flags,
    )


def no_pool(*args, **kwargs):
    raise AssertionError("a pool was started")


def outputs_in(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


@pytest.mark.parametrize("seed", range(3))
def test_one_worker_on_the_block_path_encodes_here_with_the_bytes_of_a_pool(
    tmp_path, model, seed, monkeypatch
):
    source = corpus(tmp_path / "in.jsonl", seed)
    pooled = preprocess(config_for(source, tmp_path / "pool" / "out", model, workers=2))
    monkeypatch.setattr(pipeline, "ProcessPoolExecutor", no_pool)
    here = preprocess(config_for(source, tmp_path / "here" / "out", model, workers=1))
    assert multiprocessing.active_children() == []
    for suffix in (".bin", ".idx"):
        mine = Path(here.outputs["text"] + suffix).read_bytes()
        assert mine == Path(pooled.outputs["text"] + suffix).read_bytes()
    assert (here.documents, here.tokens, here.input_bytes) == (
        pooled.documents,
        pooled.tokens,
        pooled.input_bytes,
    )


def test_one_worker_here_names_a_bad_line_and_leaves_nothing(tmp_path, model, monkeypatch):
    source = corpus(tmp_path / "in.jsonl", 0, bad=b'{"text": 3}')
    monkeypatch.setattr(pipeline, "ProcessPoolExecutor", no_pool)
    (tmp_path / "out").mkdir()
    with pytest.raises(BadInputError, match=r"in\.jsonl, line 120: key 'text' holds int"):
        preprocess(config_for(source, tmp_path / "out" / "o", model, workers=1))
    assert outputs_in(tmp_path / "out") == []
    skipped = preprocess(
        config_for(source, tmp_path / "out" / "o", model, workers=1, skip_bad_lines=True)
    )
    assert skipped.skipped_lines == 1
    assert skipped.first_skipped == [f"{source}:120 (key 'text' holds int, expected a string "
                                     "(or a list of strings))"]  # fmt: skip


def test_one_worker_here_interrupted_leaves_nothing(tmp_path, model, monkeypatch):
    source = corpus(tmp_path / "in.jsonl", 1)
    monkeypatch.setattr(pipeline, "ProcessPoolExecutor", no_pool)
    encode = Encoder.encode
    calls = []

    def interrupted(self, chunk):
        calls.append(chunk)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return encode(self, chunk)

    monkeypatch.setattr(Encoder, "encode", interrupted)
    (tmp_path / "out").mkdir()
    with pytest.raises(KeyboardInterrupt):
        preprocess(config_for(source, tmp_path / "out" / "o", model, workers=1))
    assert len(calls) == 3
    assert outputs_in(tmp_path / "out") == []


@needs_fork
@pytest.mark.parametrize("workers", [1, 2])
def test_forked_workers_take_the_encoder_built_before_the_fork(tmp_path, main_only, workers):
    """A worker that loaded the tokenizer itself would fail its start (MainOnlyTokenizer)."""
    source = corpus(tmp_path / "in.jsonl", 2)
    config = PreprocessConfig(
        str(source),
        str(tmp_path / "out"),
        main_only,
        workers=workers,
        chunk_bytes=1000,
        start_method="fork",
        log_interval=10**9,
    )
    summary = preprocess(config)
    assert summary.documents == 300


def test_a_worker_builds_its_own_encoder_unless_one_was_offered_for_its_settings(monkeypatch):
    # the worker's start, run here: keep this process's own signal handling and environment
    monkeypatch.setattr(encoding, "_die_with_parent", lambda: None)
    monkeypatch.setattr(encoding, "_ENCODER", None)
    monkeypatch.setattr(signal, "signal", lambda number, handler: None)
    monkeypatch.setenv("RAYON_NUM_THREADS", "1")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    settings = EncodeSettings("bytes", TokenizerOptions(), ("text",), False, "uint16")
    other = EncodeSettings("bytes", TokenizerOptions(), ("text",), True, "uint16")
    offered = Encoder(settings)
    with prebuilt_for_fork(offered):
        start_worker(settings)
        assert encoding._ENCODER is offered
        start_worker(other)
        assert encoding._ENCODER is not offered and encoding._ENCODER.settings == other
    start_worker(settings)  # withdrawn: built anew
    assert encoding._ENCODER is not offered and encoding._ENCODER.settings == settings


def test_what_a_fork_server_preloads_imports():
    """multiprocessing skips a preload module that fails to import without a word."""
    for name in encoding.FORKSERVER_PRELOAD:
        importlib.import_module(name)

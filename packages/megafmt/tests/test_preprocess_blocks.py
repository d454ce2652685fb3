"""The block path (megafmt.preprocess.blocks): a chunk parsed by pyarrow and encoded in one
gigatoken call gives the bytes of the line path (Python's json.loads of each line), and every
chunk it could read differently goes to the line path whole."""

import json
import random

import numpy
import pytest

from megafmt import IndexedDataset
from megafmt.cli.main import main
from megafmt.preprocess import PreprocessConfig, preprocess
from megafmt.preprocess import blocks as block_module
from megafmt.preprocess.blocks import BlockEncoder, block_path_note
from megafmt.preprocess.encoding import Encoder, EncodeSettings
from megafmt.preprocess.inputs import Chunk
from megafmt.tokenizers import TokenizerOptions

tokenizers = pytest.importorskip("tokenizers")
pytest.importorskip("gigatoken")
pytest.importorskip("pyarrow")

WORDS = ["the", "fox", "don't", "ünïcödé", "東京", "🙂", "Information", "Inf", ",", "\n", "\t", " "]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """A byte-level BPE tokenizer.json with an EOS, whose gigatoken self-check passes."""
    tokenizer = tokenizers.Tokenizer(tokenizers.models.BPE())
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    rng = random.Random(0)
    tokenizer.train_from_iterator([text(rng) for _ in range(500)], trainer)
    folder = tmp_path_factory.mktemp("bpe")
    tokenizer.save(str(folder / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>"}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return str(folder)


def text(rng: random.Random) -> str:
    return "".join(rng.choice(WORDS) for _ in range(rng.randrange(0, 40)))


#: lines the block path must not read as pyarrow would: each sends its chunk to the line path
AWKWARD_LINES = {
    "bare Inf": b'{"text": "a", "x": Inf}',
    "bare -Inf in a list": b'{"text": "a", "x": [1, -Inf]}',
    "Inf after a string's Information": b'{"text": "Information", "x": Inf}',
    "byte-order mark after a string's": b'{"text": "\xef\xbb\xbf"}\n\xef\xbb\xbf{"text": "a"}',
    "byte-order mark": b'\xef\xbb\xbf{"text": "a"}',
    "not UTF-8": b'{"text": "caf\xe9"}',
    "blank line": b"",
    "two objects": b'{"text": "a"}{"text": "b"}',
    "missing key": b'{"other": "a"}',
    "null": b'{"text": null}',
    "a list of sentences": b'{"text": ["a", "b"]}',
    "a number": b'{"text": 3}',
    "lone surrogate": b'{"text": "a\\ud800b"}',
    "not JSON": b'{"text": "a"',
    "an array": b'["a"]',
    "duplicate key": b'{"text": "a", "text": "b"}',
    "bare -NaN": b'{"text": "a", "x": -NaN}',
    "bare -NaN after a comma, no space": b'{"text": "a", "x": [1,-NaN]}',
    "bare Inf after whitespace of every kind": b'{"text": "a", "x":\t\r Inf}',
    "bare Inf after more whitespace than is looked past": b'{"text": "a", "x":'
    + b" " * 40
    + b"Inf}",
    "a NUL after the object": b'{"text": "a"}\x00',
    "lone low surrogate": b'{"text": "a\\udc00b"}',
    # pyarrow reads the block as one stream: 2 rows + 0 rows for 2 lines
    "two objects, then a blank line": b'{"text": "a"}{"text": "b"}\n',
    # 2 rows + 1 row for 3 lines
    "two objects, then an object over two lines": b'{"text": "a"}{"text": "b"}\n{"text":\n "c"}',
    "an integer of more digits than Python's json reads": b'{"text": "a", "x": '
    + b"7" * 4301
    + b"}",
    "nested deeper than Python's json reads": b'{"text": "a", "x": '
    + b"[" * 5000
    + b"]" * 5000
    + b"}",
}


def chunk_of(lines: list[bytes]) -> Chunk:
    """A chunk of ``lines`` (an item may hold several, split at its newlines)."""
    raw = b"".join(line + b"\n" for item in lines for line in item.split(b"\n"))
    return Chunk("in.jsonl", 1, 0, raw, len(raw))


def encoder(model: str, **settings) -> Encoder:
    return Encoder(
        EncodeSettings(
            "HuggingFaceTokenizer",
            TokenizerOptions(model=model),
            settings.get("json_keys", ("text",)),
            settings.get("append_eod", True),
            "uint16",
            split_sentences=settings.get("split_sentences", False),
        )
    )


def test_a_clean_chunk_takes_the_block_path_and_equals_the_line_path(model):
    rng = random.Random(1)
    records = [{"text": text(rng), "title": text(rng), "n": rng.random()} for _ in range(300)]
    lines = [json.dumps(r, ensure_ascii=rng.random() < 0.5).encode() for r in records]
    for append_eod in (False, True):
        mine = encoder(model, json_keys=("text", "title"), append_eod=append_eod)
        assert mine._blocks is not None
        blocks = mine._blocks.encode(chunk_of(lines))
        assert blocks is not None
        by_block = mine.encode(chunk_of(lines))
        mine._blocks = None  # the line path alone
        by_line = mine.encode(chunk_of(lines))
        assert not by_line.bad_lines and not by_block.bad_lines
        assert numpy.array_equal(by_block.documents, by_line.documents)
        for key in ("text", "title"):
            a, b = by_block.keys[key], by_line.keys[key]
            assert a.tokens.dtype == b.tokens.dtype == numpy.uint16
            assert numpy.array_equal(a.tokens, b.tokens)
            assert numpy.array_equal(a.sequence_lengths, b.sequence_lengths)
            assert numpy.array_equal(a.sequences_per_document, b.sequences_per_document)


@pytest.mark.parametrize("kind", sorted(AWKWARD_LINES))
def test_a_line_pyarrow_could_read_differently_sends_its_chunk_to_the_line_path(model, kind):
    blocks = encoder(model)._blocks
    clean = [b'{"text": "the fox"}', b'{"text": "Information: -Inf, \\"x\\":Inf"}']
    assert blocks.encode(chunk_of(clean)) is not None
    assert blocks.encode(chunk_of([clean[0], AWKWARD_LINES[kind], clean[0]])) is None


def test_a_suspect_inside_a_string_is_not_parsed_again(model, monkeypatch):
    """An Inf or NaN after a letter, a quote or a space is inside a string (or refused by
    pyarrow too): prose full of "Information" keeps to the quick screens. One after a value's
    opener is parsed by Python's json."""
    parsed = []
    refuses = block_module._python_refuses
    monkeypatch.setattr(
        block_module,
        "_python_refuses",
        lambda line: parsed.append(line) or refuses(line),
    )
    blocks = encoder(model)._blocks
    inside = [b'{"text": "Information and NaN or Inf \\"Inf\\" not a number"}'] * 20
    assert blocks.encode(chunk_of(inside)) is not None and parsed == []
    opener = b'{"text": "a", "x": [1, "-Inf"]}'
    assert blocks.encode(chunk_of([*inside, opener])) is not None and parsed == [opener]


def test_a_byte_order_mark_opening_a_chunk_sends_it_to_the_line_path(model):
    blocks = encoder(model)._blocks
    assert blocks.encode(chunk_of([b'{"text": "\xef\xbb\xbf"}'])) is not None
    assert blocks.encode(chunk_of([b'\xef\xbb\xbf{"text": "a"}'])) is None


#: lines the quick screens leave in doubt that Python's json reads as pyarrow does: each chunk
#: of them stays on the block path, with the line path's bytes
DOUBTFUL_BUT_CLEAN = {
    "whitespace around the object": [b' \t{"text": "a b"} \r', b'{"text": "c"}'],
    "a suspect inside a string": [b'{"text": "NaN Inf \xef\xbb\xbf"}', b'{"text": "Inf"}'],
    "Infinity in a string at the end": [b'{"text": "x"}', b'{"text": "-Infinity"}'],
    "nested deep, not too deep": [b'{"text": "a", "x": ' + b"[" * 300 + b"]" * 300 + b"}"],
    "many brackets over many lines": [b'{"text": "a", "x": [[[{}]]]}'] * 200,
    "many digits, in a string or not an integer": [
        b'{"text": "' + b"7" * 9000 + b'"}',
        b'{"text": "a", "x": ' + b"7" * 4300 + b"}",
        b'{"text": "a", "x": ' + b"7" * 5000 + b".5}",
    ],
}


@pytest.mark.parametrize("kind", sorted(DOUBTFUL_BUT_CLEAN))
@pytest.mark.parametrize("newline_at_end", [True, False])
def test_a_line_the_quick_screens_doubt_but_python_reads_stays_on_the_block_path(
    model, kind, newline_at_end
):
    """The screens look at all lines of a chunk at once and at a doubtful line by itself: a
    doubt that Python's json dispels keeps the block path, whose documents equal the line
    path's (the last line with its newline or without)."""
    mine = encoder(model)
    lines = DOUBTFUL_BUT_CLEAN[kind]
    raw = b"\n".join(lines) + (b"\n" if newline_at_end else b"")
    chunk = Chunk("in.jsonl", 1, 0, raw, len(raw))
    assert chunk.count == len(chunk.lines) == len(lines)
    assert mine._blocks.encode(chunk) is not None
    by_block = mine.encode(chunk)
    mine._blocks = None
    by_line = mine.encode(chunk)
    assert not by_block.bad_lines and not by_line.bad_lines
    assert numpy.array_equal(by_block.documents, by_line.documents)
    assert numpy.array_equal(by_block.keys["text"].tokens, by_line.keys["text"].tokens)


def test_a_suspect_in_the_chunk_s_last_line_without_a_newline_is_found(model):
    blocks = encoder(model)._blocks
    raw = b'{"text": "a"}\n{"text": "b", "x": -Inf}'
    assert blocks.encode(Chunk("in.jsonl", 1, 0, raw, len(raw))) is None
    raw = b'{"text": "a"}\n{"text": "b", "x": [' + b"[" * 5000 + b"]" * 5000 + b"]}"
    assert blocks.encode(Chunk("in.jsonl", 1, 0, raw, len(raw))) is None


def test_the_block_path_is_off_where_it_cannot_serve_and_the_note_says_why(model):
    assert encoder(model, split_sentences=False)._blocks is not None
    reference = Encoder(
        EncodeSettings(
            "HuggingFaceTokenizer", TokenizerOptions(model=model, backend="reference"),
            ("text",), True, "uint16",
        )
    )  # fmt: skip
    assert reference._blocks is None
    assert BlockEncoder.for_tokenizer(reference.tokenizer, False, ("text",), None) is None
    assert block_path_note("gigatoken", False).startswith("jsonl read by blocks")
    assert "--split-sentences" in block_path_note("gigatoken", True)
    assert "text by text" in block_path_note("reference", False)


@pytest.mark.parametrize("seed", range(3))
def test_random_corpora_with_bad_lines_give_the_line_path_s_bytes(
    tmp_path, model, seed, monkeypatch
):
    """Seeded corpora mixing clean lines and the awkward ones, small chunks so that some are
    clean and some are not: the run's bytes, counts and skipped lines equal the line path's."""
    rng = random.Random(seed)
    lines = []
    for _ in range(400):
        if rng.random() < 0.03:
            lines.append(rng.choice(list(AWKWARD_LINES.values())))
        else:
            record = {"text": text(rng)} if rng.random() < 0.98 else {"text": [text(rng)] * 2}
            lines.append(json.dumps(record, ensure_ascii=rng.random() < 0.5).encode())
    source = tmp_path / "in.jsonl"
    source.write_bytes(b"\n".join(lines) + b"\n")
    results = {}
    for path in ("block", "line"):
        if path == "line":
            monkeypatch.setattr(BlockEncoder, "encode", lambda self, chunk: None)
        config = PreprocessConfig(
            input=str(source),
            output_prefix=str(tmp_path / path / "out"),
            tokenizer_type="HuggingFaceTokenizer",
            tokenizer_options=TokenizerOptions(model=model),
            append_eod=True,
            skip_bad_lines=True,
            chunk_bytes=rng.choice([150, 150, 2000]),
            workers=rng.choice([1, 2]),
            log_interval=10**9,
        )
        results[path] = preprocess(config)
    prefixes = [results[path].outputs["text"] for path in ("block", "line")]
    for suffix in (".bin", ".idx"):
        with open(prefixes[0] + suffix, "rb") as ours, open(prefixes[1] + suffix, "rb") as line:
            assert ours.read() == line.read()
    assert results["block"].skipped_lines == results["line"].skipped_lines
    assert results["block"].first_skipped == results["line"].first_skipped
    assert len(IndexedDataset(prefixes[0]).document_indices) > 300


def test_the_cli_says_once_how_it_reads_the_jsonl(tmp_path, model, capsys):
    source = tmp_path / "in.jsonl"
    source.write_text('{"text": "the fox"}\n{"text": ""}\n')
    flags = ["preprocess", "--input", str(source), "--tokenizer-type", "HuggingFaceTokenizer"]
    flags += ["--tokenizer-model", model, "--append-eod"]
    assert main([*flags, "--output-prefix", str(tmp_path / "a")]) == 0
    err = capsys.readouterr().err
    assert err.count("input: jsonl read by blocks") == 1
    assert (
        main([*flags, "--output-prefix", str(tmp_path / "b"), "--tokenizer-backend", "reference"])
        == 0
    )
    assert "input: jsonl read line by line: the tokenizer's library" in capsys.readouterr().err


class RecordingLibrary:
    """gigatoken's tokenizer, noting the ``parallel`` of each batch it encodes."""

    def __init__(self, library):
        self.library = library
        self.parallel = []

    def encode_batch(self, texts, parallel=None):
        self.parallel.append(parallel)
        return self.library.encode_batch(texts, parallel=parallel)

    def __getattr__(self, name):
        return getattr(self.library, name)


@pytest.mark.parametrize("parallel", [False, None])
def test_the_library_s_thread_pool_is_used_as_the_encoder_says_on_either_path(model, parallel):
    """A run's main process that encodes for its one worker keeps gigatoken off its thread
    pool (it forks workers later) on the block path and for a chunk that path refuses alike."""
    settings = encoder(model).settings
    mine = Encoder(settings, parallel=parallel)
    library = mine.tokenizer._fast._tokenizer = RecordingLibrary(mine.tokenizer._fast._tokenizer)
    clean = [b'{"text": "the fox"}', b'{"text": "don\'t"}']
    for lines in (clean, [clean[0], AWKWARD_LINES["duplicate key"], clean[1]]):
        library.parallel.clear()  # the second chunk goes to the line path
        encoded = mine.encode(chunk_of(lines))
        assert len(encoded.documents) == len(lines)  # Python's json reads a duplicate key
        assert library.parallel and set(library.parallel) == {parallel}

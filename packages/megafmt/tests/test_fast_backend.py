"""The tokenizer backend: gigatoken where its self-check on the run's tokenizer.json passes,
the ``tokenizers`` library where it does not, and the one line that says which and why."""

from __future__ import annotations

import base64
import io
import json
import os

import pytest

from megafmt.cli.main import main
from megafmt.errors import PluginError
from megafmt.preprocess import PreprocessConfig, preprocess
from megafmt.tokenizers import TokenizerOptions, fast_backend, load_tokenizer
from megafmt.tokenizers.fast_backend import fixed_ids, stress_texts

tokenizers = pytest.importorskip("tokenizers")
pytest.importorskip("gigatoken")

TEXTS = ["the quick brown fox", "", "  spaces\tand\nlines ", "東京 🙂 naïve", "<mask> x <s>"]


def trained(folder, *added, template: str | None = None) -> str:
    """A byte-level BPE trained here, with ``added`` tokens, saved in ``folder``."""
    tokenizer = tokenizers.Tokenizer(tokenizers.models.BPE())
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<s>", "</s>"],
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator([" ".join(TEXTS * 3)] * 20, trainer)
    tokenizer.add_special_tokens(list(added))
    if template:
        tokenizer.post_processor = tokenizers.processors.TemplateProcessing(
            single=template, special_tokens=[("<s>", 0), ("</s>", 1)]
        )
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    return str(folder)


def reference_ids(folder: str, texts: list[str]) -> list[list[int]]:
    options = TokenizerOptions(model=folder, backend="reference")
    return load_tokenizer("huggingface", options).encode_batch(texts)


@pytest.mark.parametrize("template", [None, "<s> $A", "<s> $A </s>"])
def test_a_byte_level_bpe_is_encoded_by_gigatoken_with_the_reference_ids(tmp_path, template):
    folder = trained(tmp_path, "<mask>", template=template)
    tokenizer = load_tokenizer("huggingface", TokenizerOptions(model=folder))
    assert tokenizer.backend_choice.backend == "gigatoken"
    assert "stress texts" in tokenizer.backend_choice.reason
    assert tokenizer.encode_batch(TEXTS) == reference_ids(folder, TEXTS)
    arrays = tokenizer.encode_batch_arrays(TEXTS)
    assert [ids.tolist() for ids in arrays] == reference_ids(folder, TEXTS)


def test_text_to_ids_for_fill_in_the_middle_goes_through_the_chosen_backend(tmp_path):
    folder = trained(tmp_path, "<mask>", template="<s> $A")
    fast = load_tokenizer("huggingface", TokenizerOptions(model=folder))
    texts = stress_texts(["<mask>", "<s>"])
    assert [fast.text_to_ids(text) for text in texts] == reference_ids(folder, texts)
    assert fast.backend_choice.backend == "gigatoken"


def test_a_tokenizer_gigatoken_gets_wrong_falls_back_and_says_on_which_text(tmp_path):
    """gigatoken 0.10 does not honour single_word: the check finds it, the run is still exact."""
    folder = trained(tmp_path)
    path = tmp_path / "tokenizer.json"
    tokenizer = tokenizers.Tokenizer.from_file(str(path))
    tokenizer.add_tokens([tokenizers.AddedToken("<w>", single_word=True)])
    tokenizer.save(str(path))
    ours = load_tokenizer("huggingface", TokenizerOptions(model=folder))
    choice = ours.backend_choice
    assert choice.backend == "reference"
    assert "<w>" in choice.reason and "\n" not in choice.reason
    texts = ["a<w>b", "a <w> b", *TEXTS]
    assert ours.encode_batch(texts) == reference_ids(folder, texts)
    with pytest.raises(PluginError, match="--tokenizer-backend gigatoken: gigatoken gives"):
        load_tokenizer(
            "huggingface", TokenizerOptions(model=folder, backend="gigatoken")
        ).encode_batch(TEXTS)


@pytest.mark.parametrize("spaces", ["  ", "\n\n"])
def test_a_token_stripping_the_whitespace_before_an_added_whitespace_token_falls_back(
    tmp_path, spaces
):
    """gigatoken 0.10 strips the spaces after an ``rstrip`` special token even where they are
    an added token of their own, which ``tokenizers`` keeps: the stress sample puts added tokens
    beside runs of whitespace and beside each other, so the check finds it."""
    folder = trained(tmp_path)
    path = tmp_path / "tokenizer.json"
    tokenizer = tokenizers.Tokenizer.from_file(str(path))
    tokenizer.add_special_tokens([tokenizers.AddedToken("<sep>", rstrip=True)])
    tokenizer.add_tokens([tokenizers.AddedToken(spaces, normalized=False)])
    tokenizer.save(str(path))
    ours = load_tokenizer("huggingface", TokenizerOptions(model=folder))
    assert ours.backend_choice.backend == "reference", ours.backend_choice.reason
    texts = [f"<sep>{spaces}fox", f"dog<sep> {spaces}the", *TEXTS]
    assert ours.encode_batch(texts) == reference_ids(folder, texts)


def test_a_tokenizer_is_checked_once_per_process(tmp_path, monkeypatch):
    """Loaded again (by a run's in-process encoder, by the workers it forks), the same
    tokenizer builds gigatoken's encoder without encoding the stress sample again."""
    folder = trained(tmp_path, "<checked-once>")
    samples = []
    monkeypatch.setattr(fast_backend, "stress_texts", lambda added: samples.append(added) or [])
    for _ in range(3):
        tokenizer = load_tokenizer("huggingface", TokenizerOptions(model=folder))
        assert tokenizer.encode_batch(TEXTS) == reference_ids(folder, TEXTS)
        assert tokenizer.backend_choice.backend == "gigatoken"
    assert len(samples) == 1


def test_a_run_checks_the_backend_before_its_workers_fork(tmp_path, monkeypatch):
    """A run through the library (no CLI) checks in its own process, once: its forked workers
    inherit the verdict instead of each checking again."""
    folder = trained(tmp_path, "<checked-by-the-run>")
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps({"text": text}) + "\n" for text in TEXTS * 50))
    checks = tmp_path / "checks"
    original = fast_backend.stress_texts

    def counted(added):
        with checks.open("a") as stream:
            stream.write(f"{os.getpid()}\n")
        return original(added)

    monkeypatch.setattr(fast_backend, "stress_texts", counted)
    outputs = {}
    for backend in ("auto", "reference"):
        options = TokenizerOptions(model=folder, backend=backend)
        prefix = str(tmp_path / backend)
        config = PreprocessConfig(
            str(source), prefix, "huggingface", options, workers=2, chunk_bytes=256
        )
        preprocess(config, stream=io.StringIO())
        outputs[backend] = (tmp_path / f"{backend}_text_document.bin").read_bytes()
    assert checks.read_text().split() == [str(os.getpid())]
    assert outputs["auto"] == outputs["reference"]


def test_the_reference_backend_never_loads_gigatoken(tmp_path):
    folder = trained(tmp_path)
    tokenizer = load_tokenizer("huggingface", TokenizerOptions(model=folder, backend="reference"))
    assert tokenizer.backend_choice.backend == "reference"
    assert "reference" in tokenizer.backend_choice.reason


def test_an_unknown_backend_is_refused():
    with pytest.raises(PluginError, match="auto, gigatoken, reference"):
        TokenizerOptions(backend="fast")


def test_the_stress_sample_holds_every_kind_of_hard_text():
    texts = stress_texts(["<mask>"])
    assert "" in texts
    for needle in ("\u3000", "\u2028", "\xa0", "'re", "東", "🙂", "\u0301", "a <mask> b", "123"):
        assert any(needle in text for text in texts), needle
    assert max(map(len, texts)) >= 300
    # added tokens beside runs of whitespace and beside each other, whitespace ones first
    texts = stress_texts(["<sep>", "<x>", "  "])
    for needle in ("<sep>  fox", "<sep>\n\nx", "<sep><x>", "<x><sep>", "<sep>  ", "  <sep>"):
        assert needle in texts, needle


def test_fixed_ids_of_post_processors():
    template = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<s>"}}, {"Sequence": {"id": "A"}}],
        "special_tokens": {"<s>": {"ids": [5]}},
    }
    assert fixed_ids(None) == ([], [])
    assert fixed_ids({"type": "ByteLevel"}) == ([], [])
    assert fixed_ids(template) == ([5], [])
    assert fixed_ids({"type": "Sequence", "processors": [{"type": "ByteLevel"}, template]}) == (
        [5],
        [],
    )
    assert fixed_ids({"type": "BertProcessing"}) is None


def test_mega_preprocess_says_which_backend_once(tmp_path, capsys):
    folder = trained(tmp_path)
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps({"text": text}) + "\n" for text in TEXTS))
    common = ["preprocess", "--input", str(source), "--tokenizer-type", "huggingface"]
    common += ["--tokenizer-model", folder, "--workers", "2"]
    outputs = {}
    for backend in ("auto", "reference"):
        prefix = str(tmp_path / backend)
        argv = [*common, "--output-prefix", prefix, "--tokenizer-backend", backend]
        assert main(argv) == 0
        outputs[backend] = (tmp_path / f"{backend}_text_document.bin").read_bytes()
        said = [line for line in capsys.readouterr().err.splitlines() if "backend" in line]
        count = len(stress_texts(["<s>", "</s>"]))  # the trained tokenizer's added tokens
        expected = (
            f"tokenizer backend: gigatoken (equal to tokenizers on all {count} stress texts); "
            "checked now"
        )
        assert said == ([expected] if backend == "auto" else [])
    assert outputs["auto"] == outputs["reference"]


def tiktoken_vocabulary(path) -> str:
    """Megatron's JSON vocabulary: the 256 bytes, then byte pairs and triples of the texts."""
    sample = " ".join(TEXTS * 4).encode()
    pieces = sorted({sample[i : i + n] for n in (2, 3) for i in range(len(sample) - n)})
    ranks = [bytes([b]) for b in range(256)] + pieces
    path.write_text(
        json.dumps(
            [{"rank": i, "token_bytes": base64.b64encode(t).decode()} for i, t in enumerate(ranks)]
        )
    )
    return str(path)


@pytest.mark.parametrize(("pattern", "chosen"), [("v2", "gigatoken"), ("v1", "reference")])
def test_a_tiktoken_vocabulary_takes_gigatoken_for_the_v2_pattern(tmp_path, pattern, chosen):
    pytest.importorskip("tiktoken")
    model = tiktoken_vocabulary(tmp_path / "vocab.json")
    texts = [*TEXTS, "a</s>b <SPECIAL_9> <pad>", "caf\ud83d x"]  # a lone surrogate: tiktoken's
    ids = {}
    for backend in ("auto", "reference"):
        options = TokenizerOptions(
            model=model, vocab_size=1300, tiktoken_pattern=pattern, backend=backend
        )
        tokenizer = load_tokenizer("tiktoken", options)
        ids[backend] = tokenizer.encode_batch(texts)
        if backend == "auto":
            assert tokenizer.backend_choice.backend == chosen
            assert "tiktoken" in tokenizer.backend_choice.reason
    assert ids["auto"] == ids["reference"]


@pytest.fixture
def verdicts(tmp_path, monkeypatch):
    """A folder of remembered verdicts of its own, and no verdict in this process yet."""
    folder = tmp_path / "verdicts"
    monkeypatch.setenv("MEGAFMT_BACKEND_CHECKS", str(folder))
    monkeypatch.setattr(fast_backend, "_VERDICTS", {})
    return folder


@pytest.fixture
def checks(monkeypatch) -> list[int]:
    """One item for each self-check that runs."""
    ran: list[int] = []
    original = fast_backend._checked

    def counted(*args):
        ran.append(1)
        return original(*args)

    monkeypatch.setattr(fast_backend, "_checked", counted)
    return ran


def choice_of(folder: str, monkeypatch, backend: str = "auto"):
    """The backend choice of a run in a new process (no verdict in memory)."""
    monkeypatch.setattr(fast_backend, "_VERDICTS", {})
    tokenizer = load_tokenizer("huggingface", TokenizerOptions(model=folder, backend=backend))
    tokenizer.encode_batch(TEXTS)
    return tokenizer.backend_choice


def test_a_remembered_verdict_is_used_by_the_next_run(tmp_path, monkeypatch, verdicts, checks):
    folder = trained(tmp_path, "<remembered>")
    first = choice_of(folder, monkeypatch)
    assert first.backend == "gigatoken" and checks == [1]
    assert f"checked now, remembered in {verdicts}" in first.reason
    second = choice_of(folder, monkeypatch)
    assert second.backend == "gigatoken" and checks == [1]
    assert f"stress texts); remembered from {verdicts}" in second.reason
    tokenizer = load_tokenizer("huggingface", TokenizerOptions(model=folder))
    assert tokenizer.encode_batch(TEXTS) == reference_ids(folder, TEXTS)


def test_a_changed_tokenizer_file_is_checked_again(tmp_path, monkeypatch, verdicts, checks):
    folder = trained(tmp_path, "<changed>")
    choice_of(folder, monkeypatch)
    path = tmp_path / "tokenizer.json"
    tokenizer = tokenizers.Tokenizer.from_file(str(path))
    tokenizer.add_tokens(["<new>"])
    tokenizer.save(str(path))
    again = choice_of(folder, monkeypatch)
    assert checks == [1, 1] and "checked now" in again.reason
    assert len(list(verdicts.iterdir())) == 2


def test_a_failing_verdict_is_remembered_as_failing(tmp_path, monkeypatch, verdicts, checks):
    folder = trained(tmp_path)
    path = tmp_path / "tokenizer.json"
    tokenizer = tokenizers.Tokenizer.from_file(str(path))
    tokenizer.add_tokens([tokenizers.AddedToken("<w>", single_word=True)])
    tokenizer.save(str(path))
    first = choice_of(folder, monkeypatch)
    second = choice_of(folder, monkeypatch)
    assert checks == [1]
    assert first.backend == second.backend == "reference"
    assert "gigatoken gives" in second.reason and "remembered from" in second.reason
    with pytest.raises(PluginError, match="gigatoken gives .* remembered from"):
        choice_of(folder, monkeypatch, backend="gigatoken")
    assert checks == [1]


def test_a_check_that_ended_in_an_error_is_not_remembered(tmp_path, monkeypatch, verdicts):
    folder = trained(tmp_path, "<error>")
    original, ran = fast_backend._checked, []

    def failing_once(build, *args):
        ran.append(1)

        def out_of_memory():
            raise MemoryError("no room")

        return original(out_of_memory if len(ran) == 1 else build, *args)

    monkeypatch.setattr(fast_backend, "_checked", failing_once)
    first = choice_of(folder, monkeypatch)
    assert first.backend == "reference" and "cannot load this tokenizer (no room)" in first.reason
    assert "remembered" not in first.reason and not verdicts.exists()
    second = choice_of(folder, monkeypatch)  # the next run checks again, and passes
    assert second.backend == "gigatoken" and ran == [1, 1] and "checked now" in second.reason


@pytest.mark.parametrize("damage", ["not JSON", "another key", "cut short", "a link"])
def test_a_damaged_verdict_is_checked_again_and_rewritten(
    tmp_path, monkeypatch, verdicts, checks, damage
):
    folder = trained(tmp_path, "<damaged>")
    choice_of(folder, monkeypatch)
    (note,) = verdicts.iterdir()
    text = note.read_text()
    note.unlink()
    if damage == "a link":
        (tmp_path / "elsewhere.json").write_text(text)
        note.symlink_to(tmp_path / "elsewhere.json")
    else:
        stored = json.loads(text)
        damaged = {
            "not JSON": "{",
            "another key": json.dumps({**stored, "key": "0" * 64}),
            "cut short": text[: len(text) // 2],
        }
        note.write_text(damaged[damage])
    again = choice_of(folder, monkeypatch)
    assert checks == [1, 1] and "checked now" in again.reason and again.backend == "gigatoken"
    assert not note.is_symlink() and json.loads(note.read_text()) == json.loads(text)


def test_an_unwritable_or_switched_off_folder_only_means_checking_every_run(
    tmp_path, monkeypatch, verdicts, checks
):
    folder = trained(tmp_path, "<unwritable>")
    verdicts.write_text("a file where the folder would be")
    for _ in range(2):
        choice = choice_of(folder, monkeypatch)
        assert choice.backend == "gigatoken" and choice.reason.endswith("; checked now")
    monkeypatch.setenv("MEGAFMT_BACKEND_CHECKS", "off")
    for _ in range(2):
        assert choice_of(folder, monkeypatch).reason.endswith("; checked now")
    assert checks == [1, 1, 1, 1]

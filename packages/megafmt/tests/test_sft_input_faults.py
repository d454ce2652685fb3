"""``mega preprocess --sft`` on damaged input: a lone surrogate in a turn (a ``\\ud800`` escape)
is a bad line naming the file, line, turn and character, skipped under ``--skip-bad-lines``;
a damaged tokenizer file is an error naming it. Neither ends in a traceback."""

from __future__ import annotations

import json
import random
import shutil

import pytest

pytest.importorskip("tokenizers")

from megafmt.cli.main import main
from megafmt.sft.messages import lone_surrogate_at, messages_problem
from megafmt.sft.testing import write_sft_tokenizer

GOOD = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]


@pytest.fixture(scope="module")
def sft_tokenizer(tmp_path_factory):
    return write_sft_tokenizer(tmp_path_factory.mktemp("sft-tokenizer"))


def write_lines(path, records) -> None:
    with open(path, "w") as stream:
        stream.writelines(json.dumps({"messages": r}) + "\n" for r in records)


def sft(capsys, source, prefix, tokenizer, *extra):
    args = ["preprocess", "--sft", "--input", str(source), "--output-prefix", str(prefix)]
    status = main([*args, "--tokenizer-model", str(tokenizer), *extra])
    return status, capsys.readouterr().err


def test_a_lone_surrogate_is_a_bad_line_named_by_line_and_turn(tmp_path, sft_tokenizer, capsys):
    bad = [{"role": "user", "content": "hi \ud800 there"}, GOOD[1]]
    write_lines(tmp_path / "in.jsonl", [GOOD, bad, GOOD])
    status, err = sft(capsys, tmp_path / "in.jsonl", tmp_path / "o", sft_tokenizer)
    assert status == 1
    assert "in.jsonl, line 2" in err and "messages[0].content holds a lone surrogate" in err
    assert "Traceback" not in err and not list(tmp_path.glob("o*"))


def test_a_lone_surrogate_line_is_skipped_when_asked(tmp_path, sft_tokenizer, capsys):
    bad = [GOOD[0], {"role": "assistant", "content": "\udfff"}]
    write_lines(tmp_path / "in.jsonl", [GOOD, bad, GOOD])
    with pytest.warns(UserWarning, match="skipped 1 bad lines"):
        status, err = sft(
            capsys, tmp_path / "in.jsonl", tmp_path / "o", sft_tokenizer, "--skip-bad-lines"
        )
    assert status == 0, err


def test_lone_surrogates_anywhere_in_seeded_random_text_are_found():
    rng = random.Random(30)
    for _ in range(300):
        text = "".join(rng.choice("ab é日\n") for _ in range(rng.randint(0, 20)))
        at = rng.randint(0, len(text))
        planted = text[:at] + chr(rng.randint(0xD800, 0xDFFF)) + text[at:]
        assert lone_surrogate_at(text) is None and lone_surrogate_at(planted) == at
        field = rng.choice(["role", "content"])
        turn = {"role": "user", "content": text, field: planted}
        assert f"messages[0].{field} holds a lone surrogate" in messages_problem([turn], False)
    assert lone_surrogate_at("\U0001f600") is None  # a whole pair is a character


@pytest.mark.parametrize("damaged", ["tokenizer.json", "tokenizer_config.json"])
def test_a_damaged_tokenizer_file_is_named(tmp_path, sft_tokenizer, capsys, damaged):
    folder = tmp_path / "tok"
    shutil.copytree(sft_tokenizer, folder)
    (folder / damaged).write_text('{"broken')
    write_lines(tmp_path / "in.jsonl", [GOOD])
    status, err = sft(capsys, tmp_path / "in.jsonl", tmp_path / "o", folder)
    assert status == 1
    assert str(folder / damaged) in err and "Traceback" not in err

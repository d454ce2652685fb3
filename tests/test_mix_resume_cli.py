"""`mega load simulate --save-state/--load-state/--resume-with-new-mix/--sample-log` and `mega
load explain` over megaindex's blends: a run stopped and resumed under a new mix and layout
logs every corpus's samples once and in order; without the flag the state is refused."""

import json

import pytest

from megafmt.cli.main import main
from megafmt.testing import write_corpus


@pytest.fixture
def simulate(tmp_path):
    for number, name in enumerate(["web", "code", "math"]):
        write_corpus(str(tmp_path / name), 300, seed=number)

    def simulate(blend, dp, global_batch, steps, *extra):
        data = [item if not item.isalpha() else str(tmp_path / item) for item in blend.split()]
        arguments = ["load", "simulate", "--data-path", *data, "--split", "100,0,0"]
        arguments += ["--seq-length", "16", "--null-tokenizer", "1000", "--train-iters", "20"]
        arguments += ["--cache-dir", str(tmp_path / "cache"), "--micro-batch-size", "2"]
        arguments += ["--num-workers", "0", "--dp", str(dp)]
        arguments += ["--global-batch-size", str(global_batch), "--steps", str(steps)]
        return main([*arguments, *[str(tmp_path / e) if ".json" in e else e for e in extra]])

    return simulate


def logged(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_resumed_mix_logs_each_corpus_once_in_order(simulate, tmp_path, capsys):
    assert simulate("0.7 web 0.3 code", 2, 8, 5, "--save-state", "a.json") == 0
    first = json.loads((tmp_path / "a.json").read_text())
    assert first["consumed_samples"] == 40
    flags = ["--load-state", "a.json", "--resume-with-new-mix", "--save-state", "b.json"]
    flags += ["--sample-log", "b.jsonl"]
    assert simulate("1 code 1 math", 4, 16, 3, *flags) == 0
    samples = logged(tmp_path / "b.jsonl")
    assert [s["index"] for s in samples] == list(range(40, 88))
    assert {s["split"] for s in samples} == {"train"}
    before = {n: r["consumed"] for n, r in first["mix"]["corpora"].items()}
    for name in ("code", "math"):
        served = [s["sample"] for s in samples if s["corpus"] == str(tmp_path / name)]
        start = before.get(str(tmp_path / name), 0)
        assert served == list(range(start, start + len(served)))
        assert len(served) == 24  # equal weights over 48 samples
    assert all(s["documents"] for s in samples)
    capsys.readouterr()
    assert main(["load", "explain", str(tmp_path / "b.json")]) == 0
    text = capsys.readouterr().out
    assert "88 samples consumed (state version 4, sampler 'single')" in text
    assert "blend since sample 40: 2 corpora" in text
    assert f"removed  {tmp_path / 'web'}" in text
    assert f"{before[str(tmp_path / 'code')] + 24:>10}    0.5000  {tmp_path / 'code'}" in text


def test_without_the_flag_another_mix_is_refused(simulate, capsys):
    assert simulate("0.7 web 0.3 code", 1, 8, 2, "--save-state", "a.json") == 0
    assert simulate("0.5 web 0.5 code", 1, 8, 2, "--load-state", "a.json") != 0
    assert "it holds other samples or another order" in capsys.readouterr().err
    assert simulate("0.5 web 0.5 code", 1, 8, 2, "--resume-with-new-mix") != 0
    assert "--resume-with-new-mix needs --load-state FILE" in capsys.readouterr().err


def test_phases_with_the_flag_run_and_refuse_a_state(simulate, tmp_path, capsys):
    web, code, math = (str(tmp_path / name) for name in ("web", "code", "math"))
    phases = ["--phases", f"0:1 {web} 1 {code}", f"2:1 {code} 1 {math}"]
    assert simulate("1 web", 1, 8, 4, *phases, "--resume-with-new-mix") == 0
    assert "step 3 rank 0 phase 1" in capsys.readouterr().out
    assert simulate("1 web", 1, 8, 4, *phases, "--resume-at", "16", "--resume-with-new-mix") == 0
    assert "step 1 rank 0 phase 1" in capsys.readouterr().out  # resumed in the second phase
    (tmp_path / "a.json").write_text("{}")
    for flag in ("--save-state", "--load-state", "--sample-log"):
        assert simulate("1 web", 1, 8, 4, *phases, flag, "a.json") != 0
        error = capsys.readouterr().err
        assert "--phases does not take --load-state, --save-state or --sample-log" in error
        assert "resume a phased run with --resume-at S (its consumed samples)" in error


def test_an_unreadable_state_is_refused_naming_the_file(simulate, tmp_path, capsys):
    (tmp_path / "bad.json").write_text("{")
    assert simulate("1 web", 1, 8, 1, "--load-state", "bad.json") != 0
    assert f"--load-state {tmp_path / 'bad.json'}: " in capsys.readouterr().err
    assert main(["load", "explain", str(tmp_path / "missing.json")]) != 0
    assert f"{tmp_path / 'missing.json'}: [Errno 2]" in capsys.readouterr().err

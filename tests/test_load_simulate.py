"""`mega load simulate` over megaindex's GPT datasets: an interrupted and resumed run hashes the
same global batches as an uninterrupted one."""

from megafmt.cli.main import main
from megafmt.testing import write_corpus


def simulate(tmp_path, *extra):
    corpus = write_corpus(str(tmp_path / "corpus"), longest=40)
    return main(
        [
            "load",
            "simulate",
            "--data-path",
            corpus,
            "--split",
            "1",
            "--seq-length",
            "16",
            "--null-tokenizer",
            "1000",
            "--samples",
            "200",
            "--cache-dir",
            str(tmp_path / "cache"),
            "--global-batch-size",
            "8",
            "--micro-batch-size",
            "2",
            "--dp",
            "2",
            *extra,
        ]
    )


def test_interrupted_and_resumed_runs_read_the_same_batches(tmp_path, capsys):
    for name, extra in (
        ("whole", ["--steps", "6"]),
        ("first", ["--steps", "3"]),
        ("rest", ["--steps", "3", "--resume-at", "24"]),
    ):
        assert simulate(tmp_path, *extra, "--hash-log", str(tmp_path / name)) == 0
    whole = (tmp_path / "whole").read_text().split()
    assert len(whole) == 6
    assert (tmp_path / "first").read_text().split() + (
        tmp_path / "rest"
    ).read_text().split() == whole
    assert "disjoint and covering" in capsys.readouterr().out


def test_dry_run_resume_names_the_first_samples(tmp_path, capsys):
    assert simulate(tmp_path, "--dry-run-resume", "16") == 0
    assert capsys.readouterr().out.splitlines() == [
        "rank 0: first micro-batch after 16 consumed samples: [16, 17]",
        "rank 1: first micro-batch after 16 consumed samples: [18, 19]",
    ]


def test_the_cyclic_loader_runs_past_an_epoch(tmp_path, capsys):
    assert simulate(tmp_path, "--dataloader-type", "cyclic", "--steps", "40") == 0
    assert "40 steps of 8 samples over 2 ranks" in capsys.readouterr().out

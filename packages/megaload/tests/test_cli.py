"""``mega load``: simulate over a dataset provider registered here (no megaindex needed), and
the samplers ``--dataloader-type`` can name."""

import pytest
import torch

from megafmt.cli.main import main
from megafmt.registry import Registry
from megaload import SAMPLERS, MegatronPretrainingSampler, cli


class Numbers(torch.utils.data.Dataset):
    """Sample i is the tokens [i, i, i]."""

    def __init__(self, size):
        self.size = size

    def __len__(self):
        return self.size

    def __getitem__(self, idx):
        return {"tokens": torch.tensor([idx] * 3)}


class NumbersProvider:
    """A ``megaload.datasets`` provider: ``--numbers N`` samples."""

    def configure(self, parser):
        parser.add_argument("--numbers", type=int, default=64)

    def build(self, args):
        return [Numbers(args.numbers)]


@pytest.fixture
def providers(monkeypatch):
    """Only the provider of this test, whatever else is installed (megaindex's provider has
    required arguments of its own)."""
    registry = Registry("megaload.datasets.test", "megaload dataset provider")
    registry.register("numbers", NumbersProvider)
    monkeypatch.setattr(cli, "PROVIDERS", registry)


def simulate(*extra):
    arguments = ["--provider", "numbers", "--global-batch-size", "8", "--micro-batch-size", "2"]
    return main(["load", "simulate", *arguments, "--dp", "2", *extra])


def test_simulate_over_a_provider_checks_and_logs_the_global_batches(providers, tmp_path, capsys):
    for name, extra in (
        ("whole", ["--steps", "6"]),
        ("first", ["--steps", "3"]),
        ("rest", ["--steps", "3", "--resume-at", "24"]),
    ):
        assert simulate(*extra, "--hash-log", str(tmp_path / name)) == 0
    whole = (tmp_path / "whole").read_text().split()
    assert len(whole) == 6
    assert (tmp_path / "first").read_text().split() + (
        tmp_path / "rest"
    ).read_text().split() == whole
    out = capsys.readouterr().out
    assert "6 steps of 8 samples over 2 ranks: disjoint and covering" in out
    assert simulate("--dry-run-resume", "16") == 0
    assert capsys.readouterr().out.splitlines() == [
        "rank 0: first micro-batch after 16 consumed samples: [16, 17]",
        "rank 1: first micro-batch after 16 consumed samples: [18, 19]",
    ]


def test_simulate_names_an_unknown_provider(providers, capsys):
    assert main(["load", "simulate", "--provider", "nope", "--global-batch-size", "8",
                 "--micro-batch-size", "2"]) == 1  # fmt: skip
    assert "unknown megaload dataset provider 'nope'; available: numbers" in capsys.readouterr().err


def test_dataloader_types_come_from_the_sampler_registry(providers, capsys):
    SAMPLERS.register("sequential_too", MegatronPretrainingSampler.from_config)
    try:
        assert main(["load", "samplers"]) == 0
        listed = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
        assert listed == ["cyclic", "full_validation", "hybrid_cp", "sequential_too", "single"]
        assert simulate("--dataloader-type", "sequential_too", "--steps", "2") == 0
        assert "2 steps of 8 samples" in capsys.readouterr().out
        with pytest.raises(SystemExit):
            simulate("--dataloader-type", "random")
        assert "invalid choice: 'random'" in capsys.readouterr().err
    finally:
        SAMPLERS.unregister("sequential_too")

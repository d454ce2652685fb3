"""Importing a dataset class imports neither preprocessing nor a command line, and only the SFT
dataset imports SFT: a training job that builds GPT datasets pays for none of them (issue 31).

Each import runs in a fresh interpreter, so what other tests imported does not count.
"""

import json
import subprocess
import sys
from importlib.metadata import entry_points

import pytest

OURS = {"megafmt", "megaindex", "megaload", "megadist"}
#: the shipped dataset classes' modules (the ``megaindex.datasets`` plugins) and the blend
DATASET_MODULES = sorted(
    {
        entry.value.split(":")[0]
        for entry in entry_points(group="megaindex.datasets")
        if entry.value.startswith("megaindex.")
    }
    | {"megaindex.blended_dataset"}
)


def what_it_is(module: str) -> str | None:
    """Which of preprocessing, a command line or SFT ``module`` belongs to, if any."""
    parts = module.split(".")
    if parts[0] not in OURS:
        return None
    if parts[:2] == ["megafmt", "preprocess"]:
        return "preprocessing"
    if any(part in ("cli", "commands") or part.endswith("_cli") for part in parts):
        return "command line"
    if any(part == "sft" or part.startswith("sft_") for part in parts):
        return "SFT"
    return None


def modules_after_importing(module: str) -> list[str]:
    program = f"import json, sys, {module}; print(json.dumps(sorted(sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_the_shipped_dataset_modules_are_found():
    assert {"megaindex.gpt_dataset", "megaindex.sft_dataset"} <= set(DATASET_MODULES)


@pytest.mark.parametrize("module", DATASET_MODULES)
def test_importing_a_dataset_class_imports_no_preprocessing_cli_or_foreign_sft(module):
    allowed = {"SFT"} if what_it_is(module) == "SFT" else set()
    unwanted = {
        loaded: kind
        for loaded in modules_after_importing(module)
        if (kind := what_it_is(loaded)) is not None and kind not in allowed
    }
    assert unwanted == {}, f"importing {module} imported {unwanted}"


@pytest.mark.parametrize(
    ("module", "kind"),
    [
        ("megafmt.preprocess.pipeline", "preprocessing"),
        ("megaindex.cli", "command line"),
        ("megaindex.fim_cli", "command line"),
        ("megaload.commands", "command line"),
        ("megafmt.sft.lines", "SFT"),
        ("megaindex.sft_pack", "SFT"),
        ("megaindex.gpt_dataset", None),
        ("numpy.cli", None),
    ],
)
def test_what_it_is_recognises_each_kind(module, kind):
    assert what_it_is(module) == kind

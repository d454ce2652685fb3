"""Importing a dataset class imports neither preprocessing nor a command line, and only the SFT
dataset imports SFT: a training job that builds GPT datasets pays for none of them (issue 31).

Each import runs in a fresh fork of one fresh interpreter that has loaded only the third-party
libraries they share (torch, numpy), none of the project's modules: what other tests or the other
dataset modules imported does not count, and torch is imported once, not once per module.
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


#: one interpreter: the shared third-party libraries, then each module in a fork of its own, its
#: ``sys.modules`` sent back through a pipe; ``{module: [modules loaded]}`` on the last line
PROGRAM = """
import importlib, json, os, sys, traceback
import numpy, torch
ours = {ours!r}
preloaded = sorted(m for m in sys.modules if m.split(".")[0] in ours)
assert not preloaded, f"importing torch and numpy imported {{preloaded}}"
loaded = {{}}
for module in {modules!r}:
    read, write = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(read)
        try:
            importlib.import_module(module)
            with os.fdopen(write, "w") as pipe:
                json.dump(sorted(sys.modules), pipe)
        except BaseException:
            traceback.print_exc()
            os._exit(1)
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        sent = pipe.read()
    _, status = os.waitpid(child, 0)
    assert status == 0, f"importing {{module}} failed"
    loaded[module] = json.loads(sent)
print(json.dumps(loaded))
"""


@pytest.fixture(scope="module")
def modules_after_importing() -> dict[str, list[str]]:
    """``{dataset module: the modules loaded after importing it}``, each import in isolation."""
    program = PROGRAM.format(ours=sorted(OURS), modules=DATASET_MODULES)
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_the_shipped_dataset_modules_are_found():
    assert {"megaindex.gpt_dataset", "megaindex.sft_dataset"} <= set(DATASET_MODULES)


@pytest.mark.parametrize("module", DATASET_MODULES)
def test_importing_a_dataset_class_imports_no_preprocessing_cli_or_foreign_sft(
    module, modules_after_importing
):
    allowed = {"SFT"} if what_it_is(module) == "SFT" else set()
    unwanted = {
        loaded: kind
        for loaded in modules_after_importing[module]
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

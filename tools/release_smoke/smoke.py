"""What both release smoke tests share: the version expected, named checks, a small corpus.

The smoke tests run in fresh venvs holding only the built wheels (tools/release_check.py makes
them), so this module uses the standard library, numpy and megafmt only.
"""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

import numpy

from megafmt import IndexedDatasetBuilder

#: the end-of-document id of the corpora, megatron-core's NullTokenizer(999)
EOD = 999


def expected_version() -> str:
    """The version the release is built from: the smoke test's one argument."""
    return sys.argv[1]


@contextmanager
def check(description: str) -> Iterator[None]:
    """Run one check; print ``ok: description`` once it passed (release_check.py counts them)."""
    yield
    print(f"ok: {description}", flush=True)


def assert_installed(module: ModuleType) -> None:
    """``module`` comes from this venv's site-packages, installed from a wheel file (pip's
    direct_url.json names it), not from a source folder."""
    location = Path(module.__file__).resolve()
    assert location.is_relative_to(Path(sys.prefix).resolve()), f"{module} is not installed here"
    origin = json.loads(
        importlib.metadata.distribution(module.__name__).read_text("direct_url.json")
    )
    assert origin["url"].endswith(".whl"), f"{module.__name__} was installed from {origin['url']}"


def write_corpus(prefix: Path, seed: int, documents: int = 200) -> list[list[int]]:
    """A ``.bin``/``.idx`` pair of ``documents`` random documents, each ending in ``EOD``."""
    rng = numpy.random.default_rng(seed)
    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=numpy.uint16)
    written = []
    for length in rng.integers(8, 80, documents):
        document = [*rng.integers(0, EOD, length).tolist(), EOD]
        builder.add_document(document, lengths=[len(document)])
        written.append(document)
    builder.finalize(f"{prefix}.idx")
    return written


def mega(*arguments: str) -> str:
    """The output of this venv's ``mega`` console script, which must succeed."""
    command = [str(Path(sys.executable).parent / "mega"), *arguments]
    result = subprocess.run(command, capture_output=True, text=True)
    assert result.returncode == 0, f"{' '.join(command)} failed:\n{result.stdout}{result.stderr}"
    return result.stdout

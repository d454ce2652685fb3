"""Smoke test of the megafmt wheel alone, in a venv without torch: write a corpus, inspect it
with ``mega info``, read it back. Usage: ``python megafmt_only.py VERSION`` (in a scratch
folder)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
from pathlib import Path

from smoke import assert_installed, check, expected_version, mega, write_corpus

import megafmt


def main() -> None:
    with check("torch is not installed"):
        assert importlib.util.find_spec("torch") is None
        try:
            importlib.metadata.distribution("torch")
        except importlib.metadata.PackageNotFoundError:
            pass
        else:
            raise AssertionError("torch is installed")
    with check(f"megafmt {expected_version()} imports from the wheel"):
        assert_installed(megafmt)
        assert megafmt.__version__ == expected_version(), megafmt.__version__
    prefix = Path("corpus").resolve()
    with check("IndexedDatasetBuilder writes a corpus"):
        documents = write_corpus(prefix, seed=0)
    with check("mega info reads it"):
        info = mega("info", str(prefix))
        assert f"documents        {len(documents)}" in info, info
        assert "consistency      passed" in info, info
    with check("IndexedDataset reads it back"):
        dataset = megafmt.IndexedDataset(str(prefix))
        assert len(dataset) == len(documents)
        assert all(dataset[i].tolist() == document for i, document in enumerate(documents))


if __name__ == "__main__":
    main()

"""The seed-commit harness runs the archive's own code, apart from megatron-core 0.16.1."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from seedref import SeedArchiveMissing, SeedRaised, archive_path, seed_unavailable

pytestmark = pytest.mark.compat


def test_worker_imports_the_seed_source_not_megatron_core(seed):
    import megatron.core

    found = seed.call("seed_probe:where")
    assert found["core"].startswith(str(seed.root))
    assert found["helpers"].startswith(str(seed.root))
    assert not megatron.core.__file__.startswith(str(seed.root))


def test_seed_exceptions_come_back_with_their_classes(seed):
    with pytest.raises(SeedRaised) as raised:
        seed.call("seed_probe:fail", "no samples")
    assert raised.value.is_a("AssertionError")
    assert raised.value.message == "no samples"
    assert seed.call("seed_probe:where")  # the worker lives on after a raise


def test_without_the_archive_the_seed_is_unavailable_unless_required(tmp_path, monkeypatch):
    absent = tmp_path / "megatron-lm-e03878b5f.tar.gz"
    monkeypatch.setenv("MEGATRON_SEED_ARCHIVE", str(absent))
    monkeypatch.delenv("MEGA_REQUIRE_SEED", raising=False)
    reason = seed_unavailable()
    assert reason and str(absent) in reason and "MEGATRON_SEED_ARCHIVE" in reason
    monkeypatch.setenv("MEGA_REQUIRE_SEED", "1")
    assert seed_unavailable() is None  # so the tests that need it run, and fail loudly:
    with pytest.raises(SeedArchiveMissing, match="does not exist"):
        archive_path()


def test_without_the_archive_pytest_leaves_out_the_seed_tests_saying_so_once(tmp_path):
    folder = tmp_path / "suite"
    folder.mkdir()
    (folder / "test_two.py").write_text(
        "import pytest\n"
        "@pytest.mark.seed\n"
        "def test_needs_the_seed():\n    raise AssertionError('ran')\n"
        "def test_needs_nothing():\n    pass\n"
    )
    root = Path(__file__).resolve().parents[2]
    conftest = root / "tests" / "conftest.py"
    (folder / "conftest.py").write_text(conftest.read_text())
    environment = {**os.environ, "MEGATRON_SEED_ARCHIVE": str(tmp_path / "absent.tar.gz")}
    environment.pop("MEGA_REQUIRE_SEED", None)
    pytest_command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider"]
    done = subprocess.run(
        [*pytest_command, "-c", str(root / "pyproject.toml"), str(folder)],
        capture_output=True,
        text=True,
        cwd=root,
        env=environment,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout
    said = [line for line in done.stdout.splitlines() if "seed commit" in line]
    assert len(said) == 1 and said[0].startswith("not run: 1 tests that compare with the seed")
    assert "absent.tar.gz" in said[0] and "1 passed, 1 deselected" in done.stdout

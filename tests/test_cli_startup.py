"""``mega`` imports only the command it runs: with every package installed, ``mega info`` must
not pull in torch through the plugins of the other commands."""

import subprocess
import sys

from megafmt.testing import write_corpus


def test_mega_info_does_not_import_torch(tmp_path):
    prefix = write_corpus(str(tmp_path / "corpus"))
    code = (
        "import sys\n"
        "from megafmt.cli.main import main\n"
        f"assert main(['info', {prefix!r}]) == 0\n"
        "print('torch imported:', 'torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().endswith("torch imported: False")


def run_mega_in_fresh_process(*arguments: str) -> tuple[str, bool]:
    """What ``mega ARGUMENTS`` prints, and whether it imported torch."""
    code = (
        "import sys\n"
        "from megafmt.cli.main import main\n"
        "try:\n"
        f"    main({list(arguments)!r})\n"
        "except SystemExit:\n"
        "    pass\n"
        "print('torch imported:', 'torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return out.stdout, out.stdout.strip().endswith("torch imported: True")


def test_mega_help_lists_every_command_without_importing_torch():
    text, imported_torch = run_mega_in_fresh_process("--help")
    for command in ("info", "preprocess", "index", "sequences", "load", "dist", "demo"):
        assert f"\n    {command}" in text
    assert "build, inspect and explain GPTDataset index caches" in text
    assert not imported_torch


def test_mega_version_names_the_four_packages_without_importing_torch():
    from importlib.metadata import version

    text, imported_torch = run_mega_in_fresh_process("--version")
    for package in ("megafmt", "megaindex", "megaload", "megadist"):
        assert f"{package} {version(package)}\n" in text
    assert not imported_torch


def test_a_command_that_needs_torch_still_gets_its_arguments():
    text, imported_torch = run_mega_in_fresh_process("load", "simulate", "--help")
    assert "--micro-batch-size" in text and imported_torch


def test_importing_the_packages_imports_no_torch_until_a_name_is_used():
    code = (
        "import sys, megaindex, megaload, megadist\n"
        "print('torch' in sys.modules)\n"
        "from megaindex import GPTDataset\n"
        "print('torch' in sys.modules, GPTDataset.__module__)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[:2] == ["False", "True megaindex.gpt_dataset"]

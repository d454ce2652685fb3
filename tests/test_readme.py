"""Every ``python`` code block of the READMEs runs: the root README's blocks in order in one
namespace (each builds on the last: a corpus, its datasets, a loader, get_batch), in a
temporary folder; each package README's on its own."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)
READMES = [ROOT / "README.md", *sorted(ROOT.glob("packages/*/README.md"))]


def python_blocks(path: Path) -> list[str]:
    return BLOCK.findall(path.read_text(encoding="utf-8"))


@pytest.mark.parametrize("readme", READMES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_python_block_runs(readme: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "__readme__"}
    for number, block in enumerate(python_blocks(readme)):
        code = compile(block, f"{readme.name} python block {number + 1}", "exec")
        exec(code, namespace if readme.parent == ROOT else {"__name__": "__readme__"})


def test_the_root_readme_has_its_tour() -> None:
    assert len(python_blocks(ROOT / "README.md")) >= 4

"""Every code block of the documentation runs on its own, as written.

The blocks of README.md, packages/*/README.md and docs/**/*.md are found here; each fenced
block tagged ``python`` or ``bash`` runs alone, in a fresh temporary folder and a fresh
subprocess: python blocks with this interpreter, bash blocks with ``bash -euo pipefail`` and
this interpreter's bin folder first on PATH (so ``mega`` is the installed console script).
Blocks that are not code to run (command forms with placeholder paths, sample output, diffs)
are tagged ``text`` or ``diff`` and are not run; an untagged block, or one tagged with a name
that leaves it unclear whether it runs (``sh``, ``console``, ...), fails
``test_every_block_says_whether_it_runs``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = [
    ROOT / "README.md",
    *sorted(ROOT.glob("packages/*/README.md")),
    *sorted((ROOT / "docs").rglob("*.md")),
]
#: fence tags whose blocks run, and the command that runs the block's file
RUNNERS = {
    "python": [sys.executable],
    "bash": ["bash", "-euo", "pipefail"],
}
#: fence tags of blocks that are read, not run
NOT_RUN = {"text", "diff"}
#: seconds one block may take before it fails
TIMEOUT = 300

# The README's first block is the exception: it is exactly what CI's .ci/run executes (set up
# the venvs and run the demo, then every test, this one included), so running it here would
# recurse into the whole suite. It is recognised by its exact content and skipped.
README_COMMANDS = "make demo\nmake test\n"

OPENING = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`]*?)\s*$")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # of the opening fence, from 1
    language: str
    code: str

    @property
    def name(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def fenced_blocks(path: Path) -> list[Block]:
    """The fenced code blocks of a Markdown file, with the line of each opening fence."""
    blocks = []
    lines = path.read_text(encoding="utf-8").splitlines()
    number = 0
    while number < len(lines):
        opening = OPENING.match(lines[number])
        number += 1
        if not opening:
            continue
        fence, indent = opening["fence"], len(opening["indent"])
        closing = re.compile(rf"^ {{0,3}}{re.escape(fence[0])}{{{len(fence)},}}\s*$")
        start = number
        while number < len(lines) and not closing.match(lines[number]):
            number += 1
        if number == len(lines):
            raise AssertionError(f"{path}:{start}: a code block that is never closed")
        body = [line[indent:] if line[:indent].isspace() else line for line in lines[start:number]]
        language = opening["info"].split()[0] if opening["info"] else ""
        blocks.append(Block(path, start, language, "".join(f"{line}\n" for line in body)))
        number += 1
    return blocks


BLOCKS = [block for path in DOCUMENTS for block in fenced_blocks(path)]
RUNNABLE = [block for block in BLOCKS if block.language in RUNNERS]


def text(output: str | bytes | None) -> str:
    """What a process printed (a timed-out run's output can come back as bytes)."""
    if isinstance(output, bytes):
        return output.decode(errors="replace")
    return output or ""


def case(block: Block) -> object:
    if block.path == ROOT / "README.md" and block.code == README_COMMANDS:
        reason = "the README's two commands are what .ci/run executes; they would run every test"
        return pytest.param(block, id=block.name, marks=pytest.mark.skip(reason=reason))
    return pytest.param(block, id=block.name)


@pytest.mark.parametrize("block", [case(block) for block in RUNNABLE])
def test_block_runs_alone(block: Block, tmp_path: Path) -> None:
    script = tmp_path / ("block.py" if block.language == "python" else "block.sh")
    script.write_text(block.code, encoding="utf-8")
    work = tmp_path / "work"
    work.mkdir()
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    # caches the blocks fill (checked corpora, index copies) stay in the block's folder
    env["MEGA_CACHE_DIR"] = str(tmp_path / "cache")
    try:
        done = subprocess.run(
            [*RUNNERS[block.language], str(script)],
            cwd=work,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
        )
    except subprocess.TimeoutExpired as error:
        pytest.fail(
            f"{block.name}: the {block.language} block ran past {TIMEOUT} s\n"
            f"--- stdout\n{text(error.stdout)}\n--- stderr\n{text(error.stderr)}",
            pytrace=False,
        )
    if done.returncode != 0:
        pytest.fail(
            f"{block.name}: the {block.language} block exited {done.returncode}\n"
            f"--- block\n{block.code}--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}",
            pytrace=False,
        )


def test_every_block_says_whether_it_runs() -> None:
    unclear = [
        f"{block.name} ({block.language or 'no tag'})"
        for block in BLOCKS
        if block.language not in RUNNERS and block.language not in NOT_RUN
    ]
    assert not unclear, (
        "tag each block python or bash (it runs) or text or diff (it is read): "
        + ", ".join(unclear)
    )


def test_the_readme_starts_with_its_two_commands() -> None:
    first = fenced_blocks(ROOT / "README.md")[0]
    assert (first.language, first.code) == ("bash", README_COMMANDS)

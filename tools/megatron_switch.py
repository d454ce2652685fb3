"""Switch a Megatron-LM checkout's data path to this project: one import in place of each
definition, and the dataset imports pointed at megaindex.

    .venv/bin/python tools/megatron_switch.py CHECKOUT [--check]

Edits, in the checkout (the seed commit's layout, e03878b5f):

- ``pretrain_gpt.py``: ``def get_batch`` becomes ``from megadist.megatron import get_batch``;
  the imports of ``BlendedMegatronDatasetBuilder``, ``GPTDataset``, ``GPTDatasetConfig`` and
  ``MockGPTDataset`` come from ``megaindex``, and so, where it imports them from
  ``megatron.training.datasets`` (the seed commit does), do those of ``GPTFIMDataset`` and
  ``GPTFIMDatasetConfig`` (``--fim-data``) and ``SFTDataset`` (``--sft``, which builds it with
  the ``GPTDatasetConfig`` above);
- ``megatron/training/datasets/data_samplers.py``: ``def build_pretraining_data_loader``
  becomes ``from megaload.megatron import build_pretraining_data_loader`` (training.py imports
  it from there);
- ``megatron/training/training.py``: ``def cyclic_iter`` becomes
  ``from megaload.megatron import cyclic_iter``, and where it imports hybrid context
  parallelism's ``HybridCPDataLoaderWrapper`` from ``megatron.core.datasets.data_schedule``
  (the seed commit does), the import comes from ``megadist.megatron``;
- ``--resume-with-new-mix`` (issue 32, :mod:`megaindex.megatron_mix`): three definitions are
  wrapped, each rebound after it: ``megatron/training/arguments.py``'s ``_add_data_args`` (the
  flag), ``megatron/training/checkpointing.py``'s ``check_checkpoint_args`` (where the
  checkpoint's run left each corpus, from its saved arguments) and pretrain_gpt.py's
  ``core_gpt_dataset_config_from_args`` (the dataset config resumes the training blend from it).

Definitions are found with ``ast``, so formatting does not matter; a file already switched is
left alone. Prints the unified diff of each file it changes; ``--check`` prints it and writes
nothing.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import sys
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Switch:
    """One file's edits: definitions replaced by an import, import lines rewritten (those of
    ``imports_if_present`` only where the file has them: a checkout may predate them), and
    definitions wrapped: each of ``wrapped`` names a function of megaindex.megatron_mix that
    takes the definition (and the further arguments given), rebound after it."""

    path: str
    definitions: dict[str, str]
    imports: dict[str, str]
    imports_if_present: dict[str, str] = field(default_factory=dict)
    wrapped: dict[str, str] = field(default_factory=dict)


LOADER_IMPORT = "from megaload.megatron import build_pretraining_data_loader"

SWITCHES = (
    Switch(
        "pretrain_gpt.py",
        {"get_batch": "from megadist.megatron import get_batch"},
        {
            "from megatron.core.datasets.blended_megatron_dataset_builder import "
            "BlendedMegatronDatasetBuilder": "from megaindex import BlendedMegatronDatasetBuilder",
            "from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig, "
            "MockGPTDataset": "from megaindex import GPTDataset, GPTDatasetConfig, MockGPTDataset",
        },
        {
            "from megatron.training.datasets.fim_dataset import GPTFIMDataset, "
            "GPTFIMDatasetConfig": "from megaindex import GPTFIMDataset, GPTFIMDatasetConfig",
            "from megatron.training.datasets.sft_dataset import SFTDataset": (
                "from megaindex import SFTDataset"
            ),
        },
        wrapped={
            "core_gpt_dataset_config_from_args": (
                "with_resumed_mix(core_gpt_dataset_config_from_args)"
            )
        },
    ),
    Switch(
        "megatron/training/arguments.py",
        {},
        {},
        wrapped={"_add_data_args": "mix_resume_arguments(_add_data_args)"},
    ),
    Switch(
        "megatron/training/checkpointing.py",
        {},
        {},
        wrapped={
            "check_checkpoint_args": "keeping_checkpoint_mix(check_checkpoint_args, get_args)"
        },
    ),
    Switch(
        "megatron/training/datasets/data_samplers.py",
        {"build_pretraining_data_loader": LOADER_IMPORT},
        {},
    ),
    Switch(
        "megatron/training/training.py",
        {"cyclic_iter": "from megaload.megatron import cyclic_iter"},
        {},
        {
            "from megatron.core.datasets.data_schedule import HybridCPDataLoaderWrapper": (
                "from megadist.megatron import HybridCPDataLoaderWrapper"
            )
        },
    ),
)


class SwitchError(RuntimeError):
    """The checkout does not hold what the switch replaces."""


def switched_text(path: Path, switch: Switch) -> str:
    """The text of ``path`` with ``switch`` applied (unchanged if it already is)."""
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines(keepends=True)
    tree = ast.parse(text, filename=str(path))
    edits = []  # (first line, end line, the lines in their place)
    defined = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            defined[node.name] = (first - 1, node.end_lineno)
    for name, replacement in switch.definitions.items():
        if name in defined:
            edits.append((*defined[name], [replacement + "\n"]))
        elif replacement + "\n" not in lines:
            raise SwitchError(f"{path}: no top-level 'def {name}' to switch")
    for name, call in switch.wrapped.items():
        wrapper = [
            f"from megaindex.megatron_mix import {call.split('(')[0]}\n",
            f"{name} = {call}\n",
        ]
        if wrapper[1] in lines:
            continue
        if name not in defined:
            raise SwitchError(f"{path}: no top-level 'def {name}' to wrap")
        end = defined[name][1]
        edits.append((end, end, wrapper))
    for start, end, replacement in sorted(edits, key=lambda edit: -edit[0]):
        lines[start:end] = replacement
    result = "".join(lines)
    for old, new in switch.imports.items():
        if old in result:
            result = result.replace(old, new)
        elif new not in result:
            raise SwitchError(f"{path}: no line '{old}' to switch")
    for old, new in switch.imports_if_present.items():
        result = result.replace(old, new)
    return result


def apply(checkout: Path, write: bool = True) -> list[str]:
    """Switch ``checkout``; the unified diff of every changed file (written unless not
    ``write``)."""
    diffs = []
    for switch in SWITCHES:
        path = checkout / switch.path
        if not path.is_file():
            raise SwitchError(f"{path}: not found; is {checkout} a Megatron-LM checkout?")
        before = path.read_text(encoding="utf-8")
        after = switched_text(path, switch)
        if after == before:
            continue
        diffs.append(
            "".join(
                difflib.unified_diff(
                    before.splitlines(keepends=True),
                    after.splitlines(keepends=True),
                    f"a/{switch.path}",
                    f"b/{switch.path}",
                    n=1,
                )
            )
        )
        if write:
            path.write_text(after, encoding="utf-8")
    return diffs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkout", type=Path)
    parser.add_argument("--check", action="store_true", help="print the diff, write nothing")
    options = parser.parse_args()
    try:
        diffs = apply(options.checkout, write=not options.check)
    except SwitchError as error:
        sys.exit(f"megatron_switch: {error}")
    print("".join(diffs) or f"{options.checkout}: already switched")


if __name__ == "__main__":
    main()

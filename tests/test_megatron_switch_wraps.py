"""tools/megatron_switch.py's wrapped definitions (``--resume-with-new-mix``): each is rebound to
megaindex.megatron_mix's wrapper right after it, once; a file without it is refused. The
switched seed checkout itself: tests/compat/test_megatron_mix_switch.py."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from megatron_switch import SWITCHES, SwitchError, switched_text

ARGUMENTS = next(s for s in SWITCHES if s.path.endswith("arguments.py"))


def test_a_wrapped_definition_is_rebound_after_it_once(tmp_path: Path) -> None:
    path = tmp_path / "arguments.py"
    path.write_text("def _add_data_args(parser):\n    return parser\n\n\ndef other():\n    pass\n")
    switched = switched_text(path, ARGUMENTS)
    assert switched == (
        "def _add_data_args(parser):\n    return parser\n"
        "from megaindex.megatron_mix import mix_resume_arguments\n"
        "_add_data_args = mix_resume_arguments(_add_data_args)\n\n\ndef other():\n    pass\n"
    )
    path.write_text(switched)
    assert switched_text(path, ARGUMENTS) == switched  # already switched: left alone


def test_a_file_without_the_definition_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "arguments.py"
    path.write_text("def parse_args():\n    pass\n")
    with pytest.raises(SwitchError, match="no top-level 'def _add_data_args' to wrap"):
        switched_text(path, ARGUMENTS)

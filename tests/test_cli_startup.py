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

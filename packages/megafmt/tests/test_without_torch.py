"""megafmt works where torch cannot be imported at all."""

import subprocess
import sys
import textwrap


def test_megafmt_imports_and_works_without_torch(tmp_path):
    script = textwrap.dedent(
        f"""
        import importlib.abc, sys

        class NoTorch(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name == "torch" or name.startswith("torch."):
                    raise ImportError("torch is blocked in this test")

        sys.meta_path.insert(0, NoTorch())
        import megafmt
        from megafmt.cli.main import main
        prefix = {str(tmp_path / "c")!r}
        builder = megafmt.IndexedDatasetBuilder(prefix + ".bin")
        builder.add_document([1, 2, 3], [3])
        builder.finalize(prefix + ".idx")
        assert megafmt.IndexedDataset(prefix)[0].tolist() == [1, 2, 3]
        assert main(["verify", prefix]) == 0
        assert main(["info", prefix]) == 0
        assert "torch" not in sys.modules
        """
    )
    subprocess.run([sys.executable, "-c", script], check=True)

"""The demo `make demo` runs: write a small corpus with megafmt, inspect it with `mega`, then
show how get_batch spreads a micro-batch over 2 x 2 tensor- and context-parallel gloo ranks.

The text is tokenized as UTF-8 bytes (ids 0-255) with an end-of-document id 256, so the
vocabulary has 257 ids and the corpus is stored as uint16, as Megatron's preprocessing would.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from megafmt import DType, IndexedDataset, IndexedDatasetBuilder, get_bin_path, get_idx_path

ROOT = Path(__file__).resolve().parent.parent
EOD = 256
DOCUMENTS = [
    "Megatron reads token ids from a .bin file through an .idx index.",
    "Each document ends with an end-of-document token.",
    "megafmt writes the same bytes as megatron-core, without torch.",
    "",
    "Short.",
]


def write_corpus(prefix: Path) -> None:
    dtype = DType.optimal_dtype(EOD + 1)
    builder = IndexedDatasetBuilder(get_bin_path(str(prefix)), dtype=dtype)
    for text in DOCUMENTS:
        tokens = [*list(text.encode("utf-8")), EOD]
        builder.add_document(tokens, [len(tokens)])
    builder.finalize(get_idx_path(str(prefix)))


def mega(*arguments: str) -> None:
    print(f"\n$ mega {' '.join(arguments)}", flush=True)
    subprocess.run([str(Path(sys.executable).parent / "mega"), *arguments], check=True)


def main() -> None:
    prefix = ROOT / "build" / "demo" / "corpus"
    prefix.parent.mkdir(parents=True, exist_ok=True)
    write_corpus(prefix)
    relative = str(prefix.relative_to(ROOT))
    print(f"wrote {relative}.bin and {relative}.idx ({len(DOCUMENTS)} documents)")
    mega("info", str(prefix))
    mega("verify", str(prefix))
    mega("dump", str(prefix), "--doc", "1")
    first = IndexedDataset(str(prefix))[1]
    print("\ndocument 1 decoded:", bytes(first[first < EOD].tolist()).decode("utf-8"))
    mega("dist", "demo", "--tp", "2", "--cp", "2", "--show", "4")


if __name__ == "__main__":
    main()

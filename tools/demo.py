"""The demo `make demo` runs: tokenize a small jsonl with `mega preprocess`, inspect the corpus
with `mega`, then show how get_batch spreads a micro-batch over 2 x 2 tensor- and
context-parallel gloo ranks.

The text is tokenized as UTF-8 bytes (ids 0-255) with an end-of-document id 256 (the `bytes`
tokenizer: nothing to download), so the vocabulary has 257 ids and the corpus is stored as
uint16, as Megatron's preprocessing would.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from megafmt import IndexedDataset

ROOT = Path(__file__).resolve().parent.parent
EOD = 256
DOCUMENTS = [
    "Megatron reads token ids from a .bin file through an .idx index.",
    "Each document ends with an end-of-document token.",
    "megafmt writes the same bytes as megatron-core, without torch.",
    "",
    "Short.",
]


def write_input(path: Path) -> None:
    with open(path, "w", encoding="utf-8") as stream:
        for text in DOCUMENTS:
            stream.write(json.dumps({"text": text}) + "\n")


def mega(*arguments: str) -> None:
    print(f"\n$ mega {' '.join(arguments)}", flush=True)
    subprocess.run([str(Path(sys.executable).parent / "mega"), *arguments], check=True)


def main() -> None:
    folder = ROOT / "build" / "demo"
    folder.mkdir(parents=True, exist_ok=True)
    source = folder / "input.jsonl"
    write_input(source)
    print(f"wrote {source.relative_to(ROOT)} ({len(DOCUMENTS)} documents)")
    output = folder / "corpus"
    mega(
        "preprocess",
        "--input",
        str(source),
        "--output-prefix",
        str(output),
        "--append-eod",
        "--workers",
        "2",
    )
    prefix = folder / "corpus_text_document"
    mega("info", str(prefix))
    mega("verify", str(prefix))
    mega("dump", str(prefix), "--doc", "1")
    first = IndexedDataset(str(prefix))[1]
    print("\ndocument 1 decoded:", bytes(first[first < EOD].tolist()).decode("utf-8"))
    mega("dist", "demo", "--tp", "2", "--cp", "2", "--show", "4")


if __name__ == "__main__":
    main()

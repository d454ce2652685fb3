"""``mega dump PREFIX --doc N``: the token ids of one document (or ``--seq N``: one sequence);
with ``--tokenizer-model`` also its text, special tokens (FIM sentinels, EOD) shown as written."""

from __future__ import annotations

import argparse

from megafmt.cli.command import print_json
from megafmt.dataset import IndexedDataset
from megafmt.index import has_sequence_modes
from megafmt.remote import local_index_path
from megafmt.tokenizers import TokenizerOptions, load_text_tokenizer


def _position(value: int, count: int, what: str) -> int:
    position = value + count if value < 0 else value
    if not 0 <= position < count:
        raise IndexError(f"{what} {value} out of range: the corpus has {count}")
    return position


class DumpCommand:
    help = "print the token ids of a document or a sequence"

    def configure(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("prefix", metavar="PREFIX", help="corpus path prefix")
        which = parser.add_mutually_exclusive_group(required=True)
        which.add_argument("--doc", type=int, help="document number (negative counts from the end)")
        which.add_argument("--seq", type=int, help="sequence number (negative counts from the end)")
        parser.add_argument("--json", action="store_true", help="print JSON")
        parser.add_argument(
            "--tokenizer-model", help="decode with this tokenizer.json (or its folder) too"
        )
        parser.add_argument("--tokenizer-type", default="huggingface", help=argparse.SUPPRESS)

    def run(self, args: argparse.Namespace) -> int:
        dataset = IndexedDataset(
            args.prefix, multimodal=has_sequence_modes(local_index_path(args.prefix))
        )
        if args.doc is not None:
            documents = dataset.document_indices
            doc = _position(args.doc, len(documents) - 1, "document")
            first, last = int(documents[doc]), int(documents[doc + 1])
        else:
            first = _position(args.seq, len(dataset), "sequence")
            last = first + 1
        items = [dataset[i] for i in range(first, last)]
        sequences = [item[0] if dataset.multimodal else item for item in items]
        modes = [int(item[1]) for item in items] if dataset.multimodal else None
        texts = None
        if args.tokenizer_model:
            text = load_text_tokenizer(
                args.tokenizer_type, TokenizerOptions(model=args.tokenizer_model)
            )
            texts = [text.ids_to_text(s, remove_special_tokens=False) for s in sequences]
        if args.json:
            record = {"sequences": [s.tolist() for s in sequences]}
            if texts is not None:
                record["texts"] = texts
            record.update({"document": doc} if args.doc is not None else {"sequence": first})
            if modes is not None:
                record["modes"] = modes
            print_json(record)
        else:
            for number, sequence in enumerate(sequences):
                print(" ".join(map(str, sequence.tolist())))
                if texts is not None:
                    print(texts[number])
        return 0

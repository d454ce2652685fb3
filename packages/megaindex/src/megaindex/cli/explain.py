"""``mega index explain``: which documents, and which of their tokens, a sample is cut from."""

from __future__ import annotations

import argparse

from megafmt.redaction import redact
from megaindex.blended_dataset import BlendedDataset
from megaindex.dataset_flags import build_datasets
from megaindex.fim_dataset import GPTFIMDataset
from megaindex.sft_dataset import SFTDataset
from megaindex.tokenizer import IdentifiedTokenizer
from megaindex.utils import Split


def run_explain(args: argparse.Namespace) -> int:
    split = Split[args.split_name]
    dataset = build_datasets(args)[split.value]
    if dataset is None:
        raise ValueError(f"the {split.name} split is empty with --split {args.split}")
    if not 0 <= args.sample < len(dataset):
        raise IndexError(
            f"sample {args.sample} out of range: the {split.name} split has {len(dataset)}"
        )
    sample = args.sample
    if isinstance(dataset, BlendedDataset):
        number = int(dataset.dataset_index[sample])
        sample = int(dataset.dataset_sample_index[sample])
        dataset = dataset.datasets[number]
        print(
            f"{split.name} sample {args.sample} is sample {sample} of dataset {number} "
            f"({redact(dataset.dataset_path)}) of the blend"
        )
    if isinstance(dataset, SFTDataset):
        print(f"{split.name} " + "\n".join(dataset.describe(sample)))
        return 0
    row = int(dataset.shuffle_index[sample])
    (begin, begin_offset), (end, end_offset) = dataset.sample_index[row : row + 2].tolist()
    extra = int(dataset.config.add_extra_token_to_sequence)
    print(
        f"{split.name} sample {sample} is row {row} of the sample index: from "
        f"document_index[{begin}] offset {begin_offset} to document_index[{end}] offset "
        f"{end_offset} (+{extra} extra token)"
    )
    for document, first, count in zip(*dataset.sample_spans(sample), strict=True):
        length = int(dataset.dataset.sequence_lengths[document])
        last = length if count is None else first + count
        print(f"  document {document:>10}  tokens [{first}, {last}) of {length}")
    if args.tokens:
        if isinstance(dataset, GPTFIMDataset):
            print(
                "rearranged for fill-in-the-middle as a fresh dataset's first read (the FIM "
                "stream is stateful; --fim-sample-seeded gives each sample its own)"
            )
        text, _ = dataset._query_document_sample_shuffle_indices(sample)
        print(" ".join(map(str, text.tolist())))
        decoder = dataset.config.tokenizer
        if isinstance(decoder, IdentifiedTokenizer) and decoder.text is not None:
            print("decoded (special tokens as written):")
            print(decoder.text.ids_to_text(text, remove_special_tokens=False))
    return 0

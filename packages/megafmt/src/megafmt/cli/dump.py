"""``mega dump PREFIX --doc N``: the token ids of one document (or ``--seq N``: one sequence);
with ``--tokenizer-model`` also its text, special tokens (FIM sentinels, EOD) shown as written.

For SFT data, a pre-tokenized corpus (``mega preprocess --sft``: a ``.lossmask`` beside the
pair) or an SFT jsonl, a line's conversations (``--doc``) or one conversation (``--seq``, the
pre-tokenized corpus only) are shown as runs of prompt and loss tokens, decoded with
``--tokenizer-model`` (the SFT tokenizer folder; needed for a jsonl, which it tokenizes).
"""

from __future__ import annotations

import argparse

from megafmt.cli.command import print_json
from megafmt.dataset import IndexedDataset
from megafmt.index import has_sequence_modes
from megafmt.redaction import redact
from megafmt.remote import file_size, local_index_path
from megafmt.sft import (
    DEFAULT_PROMPT_FORMAT,
    PROMPT_FORMATS,
    JsonlLineIndex,
    SFTTokenizer,
    TokenizedConversations,
    describe_tokens,
    get_loss_mask_path,
)
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
            "--tokenizer-model",
            help="decode with this tokenizer.json (or its folder) too; for SFT data, the SFT "
            "tokenizer folder",
        )
        parser.add_argument("--tokenizer-type", default="huggingface", help=argparse.SUPPRESS)
        sft = parser.add_argument_group("SFT data (a pre-tokenized corpus or a jsonl)")
        sft.add_argument(
            "--sft-tokenizer-prompt-format",
            default=DEFAULT_PROMPT_FORMAT,
            choices=sorted(PROMPT_FORMATS),
        )

    def run(self, args: argparse.Namespace) -> int:
        is_jsonl = args.prefix.endswith((".jsonl", ".json"))
        if is_jsonl or file_size(get_loss_mask_path(args.prefix)) is not None:
            return _dump_sft(args, is_jsonl)
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


def _dump_sft(args: argparse.Namespace, is_jsonl: bool) -> int:
    """A line's (or a conversation's) tokens as prompt and loss runs, decoded when it can."""
    tokenizer = None
    if args.tokenizer_model:
        tokenizer = SFTTokenizer(args.tokenizer_model, args.sft_tokenizer_prompt_format)
    if is_jsonl:
        if tokenizer is None or args.doc is None:
            raise ValueError("mega dump of an SFT jsonl needs --doc N and --tokenizer-model")
        lines = JsonlLineIndex(args.prefix)
        line = _position(args.doc, len(lines), "line")
        where = f"line {line} (line {int(lines.lines[line])} of {args.prefix})"
        conversations = lines.tokenized_conversations(line, tokenizer)
    else:
        stored = TokenizedConversations(args.prefix)
        if args.doc is not None:
            line = _position(args.doc, len(stored), "document")
            where = f"document {line}"
            conversations = stored.tokenized_conversations(line)
        else:
            sequence = _position(args.seq, len(stored.tokens), "sequence")
            where = f"sequence {sequence}"
            conversations = [stored.conversation(sequence)]
    if args.json:
        print_json(
            {
                "where": where,
                "conversations": [
                    {"tokens": t.tolist(), "targets": y.tolist()} for t, y in conversations
                ],
            }
        )
        return 0
    decode = tokenizer.detokenize if tokenizer is not None else None
    print(f"{redact(where)}: {len(conversations)} conversations")
    for number, (tokens, targets) in enumerate(conversations):
        print(f"  conversation {number}: {len(tokens)} tokens")
        print("\n".join(describe_tokens(tokens, targets, decode)))
    return 0

"""mega preprocess against Megatron's way of preprocessing, in one run, on the same input.

    .venv/bin/python tools/bench/bench_preprocess.py [--size-mb 200] [--workers 2]
        [--tokenizer huggingface|tiktoken] [--rounds 1] [--reference megatron-core|seed]
        [--corpora synthetic prose code] [--rows FILE]

Each corpus is a jsonl of up to ``--size-mb`` MB, with a byte-level BPE tokenizer.json trained
on part of it (offline, a few seconds):

- ``synthetic``: documents of Zipf-distributed pseudo-words, one space between words (the most
  repetitive text: what a tokenizer's caches like best);
- ``prose``: English text that ships with Python, the language reference's help topics and the
  standard library's docstrings (indented lines; about 2.5 MB, whatever ``--size-mb``);
- ``code``: the standard library's own source files, one document each (indentation, long
  identifiers, rarely repeated lines: the least favourable for word caches).

``--tokenizer tiktoken`` turns the trained tokens into a tiktoken vocabulary (the 256 bytes,
then the merged tokens in id order), which needs ``--reference seed`` (megatron-core's tool
steps here are HuggingFace's). With ``--rounds N`` the two sides run N times each, alternating,
on a machine whose load changes: the ratio of each round is printed and the median round is
reported.

The baseline is Megatron's tool as it works: with ``--reference seed``, the seed commit's own
tools/preprocess_data.py (its ``main``, in this process); with ``megatron-core`` (whose wheel
does not ship the tool), the same steps from the wheel's pieces: ``multiprocessing.Pool.imap``
over lines with megatron-core's HuggingFaceTokenizer built in each worker, one document encoded
per call, one ``add_document`` per document (tools/compat/megatron_preprocess.py). Then ``mega
preprocess`` with the same flags and worker count. Prints tokens/s of each, the ratio, and
whether the outputs are byte-identical. Files go to ``build/bench/preprocess`` and are deleted.
"""

from __future__ import annotations

import argparse
import base64
import bisect
import contextlib
import filecmp
import importlib
import itertools
import json
import shutil
import subprocess
import sys
import sysconfig
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import benchreport
import numpy

REFERENCE = benchreport.enter_reference(("megatron-core", "seed"))
warnings.filterwarnings("ignore")
ROOT = Path(__file__).resolve().parents[2]

from megafmt import IndexedDataset  # noqa: E402
from megafmt.preprocess import PreprocessConfig, preprocess  # noqa: E402
from megafmt.tokenizers import TokenizerOptions  # noqa: E402


def synthetic_documents(seed: int = 0) -> Iterator[str]:
    """Documents of Zipf-distributed pseudo-words, ~0.2-6 KB each, 4000 distinct ones in turn."""
    rng = numpy.random.default_rng(seed)
    letters = numpy.array(list("abcdefghijklmnopqrstuvwxyzéü"))
    words = ["".join(rng.choice(letters, rng.integers(1, 10))) for _ in range(20000)]
    documents = []
    for _ in range(4000):
        ids = numpy.minimum(rng.zipf(1.2, rng.integers(40, 1000)), len(words)) - 1
        text = " ".join(words[i] for i in ids)
        documents.append(text.capitalize() + ".")
    return itertools.cycle(documents)


def prose_documents() -> Iterator[str]:
    """The language reference's help topics, then the standard library's docstrings."""
    from megafmt.demo.corpora import library_docstrings, reference_topics

    return itertools.chain(reference_topics(), library_docstrings(10**6))


def code_documents() -> Iterator[str]:
    """The standard library's source files, one document each, in path order."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(stdlib.rglob("*.py")):
        try:
            yield path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue


CORPORA: dict[str, Callable[[], Iterator[str]]] = {
    "synthetic": synthetic_documents,
    "prose": prose_documents,
    "code": code_documents,
}


def make_input(path: Path, size_mb: float, corpus: str = "synthetic") -> int:
    """Up to ``size_mb`` MB of ``corpus`` as jsonl (less if it runs out); the line count."""
    lines, written, limit = 0, 0, size_mb * 1e6
    with open(path, "w", encoding="utf-8") as stream:
        for text in CORPORA[corpus]():
            if written >= limit:
                break
            line = json.dumps({"text": text}) + "\n"
            stream.write(line)
            written += len(line.encode())
            lines += 1
    return lines


#: At most this many characters of a corpus train its tokenizer (the first 4000 documents).
TRAINING_TEXT = 4_000_000


def train_tokenizer(directory: Path, sample: Path, vocab_size: int) -> None:
    """A byte-level BPE of ``vocab_size`` tokens trained on the start of ``sample``, saved in
    ``directory``; trained in a process of its own. The ``tokenizers`` library's training
    leaves its thread pool running, and in a process holding threads it did not start with,
    ``preprocess()`` starts its workers from a fork server (megafmt.preprocess.pool), each
    importing this script and its reference: not the state of a process that runs mega
    preprocess alone, and 5 to 50 times slower on a small corpus."""
    command = [sys.executable, __file__, "--train-tokenizer", directory, sample, vocab_size]
    subprocess.run([str(part) for part in command], check=True)


def _train_tokenizer_here(directory: Path, sample: Path, vocab_size: int) -> None:
    import tokenizers

    tokenizer = tokenizers.Tokenizer(tokenizers.models.BPE())
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    with open(sample, encoding="utf-8") as stream:
        texts = [json.loads(line)["text"] for line in itertools.islice(stream, 4000)]
    texts = texts[
        : max(1, bisect.bisect(list(itertools.accumulate(map(len, texts))), TRAINING_TEXT))
    ]
    tokenizer.train_from_iterator(texts, trainer)
    tokenizer.save(str(directory / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>"}
    (directory / "tokenizer_config.json").write_text(json.dumps(config))


def byte_level_bytes() -> dict[str, int]:
    """The byte each character of a byte-level BPE token stands for (GPT-2's mapping: the
    printable bytes as themselves, the others as the characters from 256 on)."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    others = [b for b in range(256) if b not in printable]
    return {chr(b): b for b in printable} | {chr(256 + i): b for i, b in enumerate(others)}


def write_tiktoken_vocab(directory: Path) -> TokenizerOptions:
    """The trained tokenizer.json's BPE tokens as Megatron's tiktoken JSON vocabulary."""
    model = json.loads((directory / "tokenizer.json").read_text())["model"]["vocab"]
    to_byte = byte_level_bytes()
    merged = [
        bytes(to_byte[c] for c in token)
        for token, _ in sorted(model.items(), key=lambda item: item[1])
        if len(token) > 1 and all(c in to_byte for c in token)
    ]
    ranks = [bytes([b]) for b in range(256)] + merged
    entries = [
        {"rank": i, "token_bytes": base64.b64encode(t).decode(), "token_str": ""}
        for i, t in enumerate(ranks)
    ]
    (directory / "tiktoken.json").write_text(json.dumps(entries))
    return TokenizerOptions(model=str(directory / "tiktoken.json"), vocab_size=len(ranks) + 1000)


TOKENIZER_TYPES = {"huggingface": "HuggingFaceTokenizer", "tiktoken": "TikTokenizer"}


def reference_tool(
    tokenizer_type: str, options: TokenizerOptions, source: Path, prefix: Path, workers: int
):
    """A function that runs the reference's preprocessing of ``source`` into ``prefix`` (its
    imports done now, so they are not timed) and returns the text key's output prefix."""
    if REFERENCE == "seed":
        tool = importlib.import_module("tools.preprocess_data")  # the seed source's tools/
        argv = [
            "preprocess_data.py",
            f"--input={source}",
            f"--output-prefix={prefix}",
            f"--tokenizer-type={tokenizer_type}",
            f"--tokenizer-model={options.model}",
            *([f"--vocab-size={options.vocab_size}"] if options.vocab_size else []),
            f"--workers={workers}",
            "--append-eod",
            f"--log-interval={10**9}",
        ]

        def run() -> str:
            with contextlib.ExitStack() as stack:
                stack.callback(setattr, sys, "argv", sys.argv)
                sys.argv = argv
                tool.main()
            return f"{prefix}_text_document"

        return run
    sys.path.insert(0, str(ROOT / "tools" / "compat"))
    from megatron_preprocess import megatron_tool_pool, tokenizer_args

    arguments = tokenizer_args(tokenizer_type, options)
    return lambda: megatron_tool_pool(arguments, str(source), str(prefix), ["text"], True, workers)[
        "text"
    ]


def bench_corpus(corpus: str, args: argparse.Namespace, report: benchreport.Report) -> None:
    """The rounds of both sides on one corpus, and its figure."""
    tokenizer_type = TOKENIZER_TYPES[args.tokenizer]
    work = ROOT / "build" / "bench" / "preprocess"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    try:
        source = work / "input.jsonl"
        lines = make_input(source, args.size_mb, corpus)
        train_tokenizer(work, source, args.vocab_size)
        options = TokenizerOptions(model=str(work))
        described = f"HuggingFace byte-level BPE, vocab {args.vocab_size}"
        if args.tokenizer == "tiktoken":
            options = write_tiktoken_vocab(work)
            described = f"tiktoken (the same BPE tokens), vocab {options.vocab_size}"
        conditions = (
            f"{corpus} jsonl, {lines:,} documents, {source.stat().st_size / 1e6:.3g} MB, "
            f"{args.workers} workers, {described}, --append-eod"
        )
        report.heading(f"preprocess: {conditions}")
        run_reference = reference_tool(
            tokenizer_type, options, source, work / "reference" / "out", args.workers
        )
        config = PreprocessConfig(
            input=str(source),
            output_prefix=str(work / "megafmt" / "out"),
            tokenizer_type=tokenizer_type,
            tokenizer_options=options,
            append_eod=True,
            workers=args.workers,
            log_interval=10**9,
        )
        rounds = []  # (reference seconds, our seconds, identical)
        for _ in range(args.rounds):
            for side in ("reference", "megafmt"):
                shutil.rmtree(work / side, ignore_errors=True)
                (work / side).mkdir()
            start = time.perf_counter()
            theirs = run_reference()
            reference_seconds = time.perf_counter() - start
            start = time.perf_counter()
            ours = preprocess(config).outputs["text"]
            our_seconds = time.perf_counter() - start
            same = all(filecmp.cmp(ours + s, theirs + s, shallow=False) for s in (".bin", ".idx"))
            rounds.append((reference_seconds, our_seconds, same))
            print(
                f"round {len(rounds)}: reference {reference_seconds:.1f} s, megafmt "
                f"{our_seconds:.1f} s, ratio {reference_seconds / our_seconds:.2f}x, "
                f"byte-identical: {'yes' if same else 'NO'}",
                flush=True,
            )
        reference_seconds, our_seconds, _ = sorted(rounds, key=lambda r: r[0] / r[1])[
            len(rounds) // 2
        ]
        tokens = int(IndexedDataset(ours).sequence_lengths.sum())
        report.compare(
            f"preprocess throughput, {corpus}",
            ours=tokens / our_seconds / 1e6,
            theirs=tokens / reference_seconds / 1e6,
            unit="M tokens/s",
            higher_is_better=True,
            conditions=conditions,
        )
        ratios = ", ".join(f"{r / o:.2f}x" for r, o, _ in rounds)
        report.note(
            f"{tokens:,} tokens; {source.stat().st_size / our_seconds / 1e6:.1f} MB/s ours, "
            f"{source.stat().st_size / reference_seconds / 1e6:.1f} MB/s the reference's "
            f"(the median of {len(rounds)} alternating rounds: {ratios}); outputs "
            f"byte-identical: {'yes' if all(same for *_, same in rounds) else 'NO'}"
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--train-tokenizer":
        _train_tokenizer_here(Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4]))
        return
    parser = benchreport.parser(__doc__)
    parser.add_argument("--size-mb", type=float, default=200)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--vocab-size", type=int, default=8192)
    parser.add_argument("--tokenizer", choices=sorted(TOKENIZER_TYPES), default="huggingface")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--corpora", nargs="+", choices=sorted(CORPORA), default=list(CORPORA))
    args = parser.parse_args()
    if args.tokenizer == "tiktoken" and REFERENCE != "seed":
        parser.error("--tokenizer tiktoken needs --reference seed")
    report = benchreport.Report("preprocess", REFERENCE, args.rows)
    for corpus in args.corpora:
        bench_corpus(corpus, args, report)


if __name__ == "__main__":
    main()

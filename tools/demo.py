"""The tour `make demo` (and `mega`-free `python tools/demo.py`) runs, on real English text that
ships with Python, with no network: every stage of the pipeline a trainer uses.

1. Two corpora (the language reference's help topics; the standard library's docstrings) are
   written as jsonl; a byte-level BPE tokenizer is trained on them (the `tokenizers` library).
2. `mega preprocess` tokenizes both (progress bars), `mega verify` checks them.
3. megaindex builds a blend of the two (weights 0.6 / 0.4) with a 90,8,2 split, cached.
4. megaload reads the training split on 2 data-parallel ranks with 2 workers each; rank 0's
   loader is dropped half-way and resumed from its `state_dict` in a new loader, and its
   batches are checked against an uninterrupted run.
5. The real micro-batches go through megadist's `get_batch` on 4 gloo ranks (TP=2 x CP=2);
   every rank's share is checked against the zigzag split of the batch its group read.
6. One sample is decoded back to text, and a summary table is printed (tokens, samples,
   epochs, realised blend weights, seconds per stage, samples/s), with a PNG of the realised
   blend over steps and the document-length histogram (when matplotlib is installed).

`--size small` runs a short tour (CI does); `--summary FILE` writes the summary as JSON.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy

sys.path.insert(0, str(Path(__file__).resolve().parent))

from demo_data import (
    build_datasets,
    library_docstrings,
    reference_topics,
    train_tokenizer,
    training_loader,
    write_jsonl,
)

ROOT = Path(__file__).resolve().parent.parent
SIZES = {
    "small": {"docstrings": 1500, "vocab": 2000, "seq_length": 64, "steps": 12, "samples": 400},
    "full": {"docstrings": 20000, "vocab": 8000, "seq_length": 256, "steps": 60, "samples": 4000},
}
WEIGHTS = [0.6, 0.4]
MICRO_BATCH_SIZE = 4


class Stages:
    """Seconds per stage, printed as each ends."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def run(self, name: str, title: str, work: Callable[[], Any]) -> Any:
        print(f"\n== {title}", flush=True)
        start = time.perf_counter()
        result = work()
        self.seconds[name] = time.perf_counter() - start
        print(f"   ({self.seconds[name]:.1f} s)", flush=True)
        return result


def mega(*arguments: str) -> None:
    print(f"$ mega {' '.join(arguments)}", flush=True)
    subprocess.run([str(Path(sys.executable).parent / "mega"), *arguments], check=True)


def write_corpora(folder: Path, size: dict) -> dict[str, list[str]]:
    corpora = {"topics": reference_topics(), "docstrings": library_docstrings(size["docstrings"])}
    for name, documents in corpora.items():
        write_jsonl(folder / f"{name}.jsonl", documents)
        print(f"   {name}: {len(documents)} documents, {sum(map(len, documents)) / 1e6:.2f} MB")
    return corpora


def preprocess(folder: Path, tokenizer: Path) -> list[str]:
    prefixes = []
    for name in ("topics", "docstrings"):
        mega(
            "preprocess",
            "--input",
            str(folder / f"{name}.jsonl"),
            "--output-prefix",
            str(folder / name),
            "--tokenizer-type",
            "HuggingFaceTokenizer",
            "--tokenizer-model",
            str(tokenizer),
            "--append-eod",
            "--workers",
            "2",
        )
        prefix = str(folder / f"{name}_text_document")
        mega("verify", prefix)
        prefixes.append(prefix)
    return prefixes


def read_loader(settings: dict, dp_rank: int, dp_size: int, steps: int) -> list[dict]:
    loader = training_loader(settings, dp_rank, dp_size=dp_size, workers=2, consumed=0)
    batches = []
    for batch in loader:
        batches.append({key: value.clone() for key, value in batch.items()})
        if len(batches) == steps:
            break
    return batches


def loaders_with_resume(settings: dict, steps: int) -> dict[str, Any]:
    """Both ranks' batches, and rank 0's again, stopped half-way and resumed from its state."""
    ranks = [read_loader(settings, rank, 2, steps) for rank in (0, 1)]
    half = steps // 2
    first = training_loader(settings, 0, dp_size=2, workers=2, consumed=0)
    before = []
    for batch in first:
        before.append({key: value.clone() for key, value in batch.items()})
        if len(before) == half:
            break
    state = first.state_dict()
    del first  # the process that held it is gone; a new loader continues from its state
    resumed = training_loader(settings, 0, dp_size=2, workers=2, consumed=0)
    resumed.load_state_dict(state)
    after = []
    for batch in resumed:
        after.append({key: value.clone() for key, value in batch.items()})
        if len(after) == steps - half:
            break
    same = all(
        all(bool((a[key] == b[key]).all()) for key in a)
        for a, b in zip(ranks[0], before + after, strict=True)
    )
    print(f"   rank 0 stopped after {half} steps and resumed: identical batches: {same}")
    return {"ranks": ranks, "resume_identical": same, "resumed_at": state["consumed_samples"]}


def get_batch_on_gloo(settings: dict, steps: int) -> dict[str, Any]:
    """TP=2 x CP=2 on 4 gloo ranks (one data-parallel rank): every rank's tensors against the
    zigzag split of the micro-batch its group read."""
    from demo_ranks import rank_main

    from megadist import zigzag_split
    from megadist.spawn import run_distributed

    full_batches = read_loader(settings, 0, 1, steps)
    reports = run_distributed(rank_main, 4, settings, steps, timeout=600)
    shapes_right = True
    for report in reports:
        for step, held in enumerate(report["steps"]):
            expected = zigzag_split(
                {k: v for k, v in full_batches[step].items() if k != "dataset_id"},
                report["cp_rank"],
                2,
            )
            for key, (shape, values) in held.items():
                right = list(expected[key].shape) == shape
                right = right and numpy.array_equal(numpy.array(values), expected[key].numpy())
                shapes_right = shapes_right and right
        keys = ", ".join(f"{k} {v[0]}" for k, v in report["steps"][0].items())
        print(f"   rank {report['rank']} ({report['where']}): {keys}")
    print(f"   every rank holds its zigzag share of its group's micro-batch: {shapes_right}")
    return {"ranks_right": shapes_right}


def decode_one(tokenizer: Path, batch: dict, eod: int, corpora: dict) -> dict[str, Any]:
    """The longest stretch between end-of-document tokens in the first sample, as text."""
    from tokenizers import Tokenizer

    tokens = batch["tokens"][0].tolist()
    pieces, current = [], []
    for token in tokens:
        if token == eod:
            pieces.append(current)
            current = []
        else:
            current.append(token)
    pieces.append(current)
    longest = max(pieces, key=len)
    text = Tokenizer.from_file(str(tokenizer / "tokenizer.json")).decode(longest)
    probe = text[2:-2] if len(text) > 8 else text  # the window may cut a character at its ends
    found = any(probe in document for documents in corpora.values() for document in documents)
    print(f"   decoded ({len(longest)} tokens): {text[:300]!r}")
    print(f"   found in the corpus: {found}")
    return {"text": text, "found_in_corpus": found}


def plot(path: Path, ranks: list[list[dict]], lengths: dict[str, numpy.ndarray]) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("   matplotlib is not installed: no plot")
        return False
    ids = numpy.concatenate([batch["dataset_id"].numpy() for batch in ranks[0]])
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    steps = numpy.arange(1, len(ids) + 1)
    for source, name in enumerate(lengths):
        left.plot(
            steps, numpy.cumsum(ids == source) / steps, label=f"{name} (weight {WEIGHTS[source]})"
        )
        left.axhline(WEIGHTS[source], linestyle=":", color="grey")
        right.hist(lengths[name], bins=60, alpha=0.6, label=name, log=True)
    left.set(title="realised blend, rank 0", xlabel="samples read", ylabel="share")
    right.set(title="document lengths", xlabel="tokens", ylabel="documents")
    left.legend()
    right.legend()
    figure.tight_layout()
    figure.savefig(path)
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="full")
    parser.add_argument("--output", default=str(ROOT / "build" / "demo"))
    parser.add_argument("--summary", help="also write the summary as JSON to this file")
    options = parser.parse_args()
    size = SIZES[options.size]
    folder = Path(options.output)
    folder.mkdir(parents=True, exist_ok=True)
    stages = Stages()
    corpora = stages.run(
        "corpora",
        "1. two corpora from the Python installation",
        lambda: write_corpora(folder, size),
    )
    tokenizer = stages.run(
        "tokenizer",
        "1. a byte-level BPE tokenizer trained on them",
        lambda: train_tokenizer(
            [d for docs in corpora.values() for d in docs], folder / "tokenizer", size["vocab"]
        ),
    )
    prefixes = stages.run(
        "preprocess", "2. mega preprocess, mega verify", lambda: preprocess(folder, tokenizer)
    )

    from megafmt import IndexedDataset
    from megafmt.tokenizers import TokenizerOptions, load_tokenizer

    loaded = load_tokenizer("huggingface", TokenizerOptions(model=str(tokenizer)))
    samples = size["samples"]
    settings = {
        "prefixes": prefixes,
        "weights": WEIGHTS,
        "seq_length": size["seq_length"],
        "micro_batch_size": MICRO_BATCH_SIZE,
        "samples": [samples, samples // 10, samples // 20],
        "cache": str(folder / "cache"),
        "eod": loaded.eod,
        "vocab_size": loaded.vocab_size,
        "tokenizer": loaded.fingerprint,
    }
    splits = stages.run(
        "index", "3. megaindex: a blend of both, split 90,8,2", lambda: build_datasets(settings)
    )
    for name, dataset in zip(("train", "valid", "test"), splits, strict=True):
        print(f"   {name}: {len(dataset)} samples of {size['seq_length']} tokens")
    steps = size["steps"]
    start = time.perf_counter()
    loaded_batches = stages.run(
        "loader",
        "4. megaload: 2 data-parallel ranks x 2 workers, stopped and resumed",
        lambda: loaders_with_resume(settings, steps),
    )
    loader_seconds = time.perf_counter() - start
    gloo = stages.run(
        "get_batch",
        "5. megadist: get_batch on TP=2 x CP=2 gloo ranks",
        lambda: get_batch_on_gloo(settings, 3),
    )
    decoded = stages.run(
        "decode",
        "6. one sample decoded",
        lambda: decode_one(tokenizer, loaded_batches["ranks"][0][0], loaded.eod, corpora),
    )

    corpus_tokens, lengths, documents = {}, {}, {}
    for name, prefix in zip(corpora, prefixes, strict=True):
        dataset = IndexedDataset(prefix)
        lengths[name] = numpy.asarray(dataset.sequence_lengths)
        corpus_tokens[name] = int(lengths[name].sum())
        documents[name] = len(dataset)
    ids = numpy.concatenate(
        [batch["dataset_id"].numpy() for rank in loaded_batches["ranks"] for batch in rank]
    )
    realised = [float((ids == source).mean()) for source in range(len(prefixes))]
    read = len(ids)
    train = splits[0]
    per_epoch = [part._get_num_tokens_per_epoch() for part in train.datasets]
    epochs = {
        name: {
            "in_the_index": train.datasets[source]._get_num_epochs(per_epoch[source]),
            "read": round(float((ids == source).sum()) * size["seq_length"] / per_epoch[source], 4),
        }
        for source, name in enumerate(corpora)
    }
    png = folder / "demo.png"
    plotted = plot(png, loaded_batches["ranks"], lengths)
    summary = {
        "corpora": {
            name: {"documents": documents[name], "tokens": corpus_tokens[name]} for name in corpora
        },
        "samples": {"train": len(train), "valid": len(splits[1]), "test": len(splits[2])},
        "weights": WEIGHTS,
        "realised_weights": realised,
        "epochs": epochs,
        "samples_read": read,
        "loader_samples_per_second": round(read / loader_seconds, 1),
        "resume_identical": loaded_batches["resume_identical"],
        "get_batch_ranks_right": gloo["ranks_right"],
        "decoded_found_in_corpus": decoded["found_in_corpus"],
        "seconds": {name: round(value, 2) for name, value in stages.seconds.items()},
        "plot": str(png) if plotted else None,
    }
    print("\n== summary")
    rows = [
        *(
            (f"corpus {name}", f"{documents[name]} documents, {corpus_tokens[name]:,} tokens")
            for name in corpora
        ),
        (
            "samples (train / valid / test)",
            "{train} / {valid} / {test}".format(**summary["samples"]),
        ),
        ("blend weights asked", " / ".join(f"{w:.2f}" for w in WEIGHTS)),
        (
            "blend weights realised",
            " / ".join(f"{w:.2f}" for w in realised) + f" (over {read} samples)",
        ),
        *(
            (f"epochs of {k} (indexed / read)", f"{v['in_the_index']} / {v['read']}")
            for k, v in epochs.items()
        ),
        ("loader samples/s, start-up included", f"{summary['loader_samples_per_second']}"),
        ("resume gave the same samples", str(summary["resume_identical"])),
        ("get_batch: every rank's share right", str(summary["get_batch_ranks_right"])),
        ("decoded sample is corpus text", str(summary["decoded_found_in_corpus"])),
        *((f"seconds: {name}", f"{value:.1f}") for name, value in stages.seconds.items()),
        ("plot", summary["plot"] or "-"),
    ]
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"  {name:<{width}}  {value}")
    if options.summary:
        Path(options.summary).write_text(json.dumps(summary, indent=2))
    if not (summary["resume_identical"] and summary["get_batch_ranks_right"]):
        sys.exit("the demo's checks failed")


if __name__ == "__main__":
    main()

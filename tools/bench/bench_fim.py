"""Fill-in-the-middle sampling: megaindex's GPTFIMDataset against its plain GPTDataset and
against the seed commit's GPTFIMDataset (Megatron-LM e03878b5f, run in its worker process by
testing/seedref.py), on one corpus, tokenizer and configuration.

    .venv/bin/python tools/bench/bench_fim.py [--seq-length 4096] [--samples 300] [--rows FILE]

The tokenizer is a byte-level BPE trained here on code-like text (no download); the corpus is
documents of that text, tokenized, each ending in EOD. Every column reads the same samples in
the same order, one ``__getitem__`` at a time, after one warm-up read. Printed: microseconds
per sample for each column (ours also at fim_rate 0: the walk over segments without any
rearranging), the FIM/plain ratio (the issue's bar: at most 2), the seed/ours ratio, and how
much of a FIM sample is the tokenizer's decode and encode (which both implementations call the
same number of times, on the same texts). megatron-core's wheel has no FIM dataset (it lives in
megatron.training), so the seed commit is the only reference. Files go to ``build/bench_fim``
and are deleted at the end.
"""

from __future__ import annotations

import random
import shutil
import sys
import time
import warnings
from pathlib import Path

import benchreport

ROOT = Path(__file__).resolve().parents[2]
WORKDIR = ROOT / "build" / "bench_fim"
SEEDSIDE = ROOT / "tests" / "compat" / "seedside"
sys.path.insert(0, str(ROOT / "testing"))
from fimtesting import FIM_EXTRA_TOKENS, code_text, write_code_corpus, write_tokenizer  # noqa: E402
from seedref import SeedProcess  # noqa: E402

IDENTIFIERS = {"class": "bench.fim.ByteLevelBPE"}
FIM_FIELDS = {
    "fim_rate": 0.5,  # Megatron-LM's --fim-rate and --fim-spm-rate defaults
    "fim_spm_rate": 0.5,
    "fim_extra_tokens": FIM_EXTRA_TOKENS,
}


class TimedTokenizer:
    """A TextTokenizer that adds up the time its decode and encode calls take."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.eod = inner.eod
        self.vocab_size = inner.vocab_size
        self.seconds = 0.0

    def tokens_to_ids(self, tokens):
        return self.inner.tokens_to_ids(tokens)

    def _timed(self, method, *args, **kwargs):
        start = time.perf_counter()
        result = method(*args, **kwargs)
        self.seconds += time.perf_counter() - start
        return result

    def text_to_ids(self, text):
        return self._timed(self.inner.text_to_ids, text)

    def ids_to_text(self, ids, remove_special_tokens=True):
        return self._timed(self.inner.ids_to_text, ids, remove_special_tokens=remove_special_tokens)


def per_sample(dataset, count: int) -> float:
    """Seconds per sample over the first ``count`` samples."""
    start = time.perf_counter()
    for idx in range(count):
        dataset[idx % len(dataset)]
    return (time.perf_counter() - start) / count


def ours(
    prefix: str, text, sequence_length: int, samples: int, cls_name: str, cache: str, **fields
):
    import megaindex
    from megaindex.tokenizer import IdentifiedTokenizer

    config = megaindex.GPTFIMDatasetConfig(
        random_seed=1234,
        sequence_length=sequence_length,
        blend=([prefix], None),
        split="100,0,0",
        tokenizer=IdentifiedTokenizer(text.eod, text.vocab_size, IDENTIFIERS, text=text),
        path_to_cache=cache,
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
        **{**FIM_FIELDS, **fields},
    )
    cls = getattr(megaindex, cls_name)
    builder = megaindex.BlendedMegatronDatasetBuilder(cls, [samples, 0, 0], lambda: True, config)
    dataset = builder.build()[0]
    dataset[0]  # warm-up read
    return dataset


def state(report: benchreport.Report, columns: dict[str, float], share: float, conditions: str):
    """Each column in microseconds per sample, ours against the seed's, then the ratios."""
    plain, fim, theirs, untouched = columns.values()
    for name, seconds in columns.items():
        report.note(f"{name:<34} {seconds * 1e6:>10.1f} us/sample")
    report.compare(
        "GPTFIMDataset __getitem__",
        ours=fim * 1e6,
        theirs=theirs * 1e6,
        unit="us/sample",
        conditions=conditions,
    )
    report.note(
        f"FIM / plain (ours): {fim / plain:.2f}x (bar: at most 2x); at fim_rate 0 (the "
        f"walk without rearranging): {untouched / plain:.2f}x"
    )
    rest = fim * (1 - share)
    report.note(
        f"tokenizer decode + encode: {share:.0%} of our FIM sample time; the rest, "
        f"{rest * 1e6:.1f} us/sample, is {rest / plain:.2f}x a plain sample"
    )


def main() -> None:
    parser = benchreport.parser(__doc__, choices=("seed",))
    parser.add_argument("--seq-length", type=int, default=4096)
    parser.add_argument("--samples", type=int, default=300, help="FIM samples per column")
    parser.add_argument("--documents", type=int, default=3000)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    import logging

    logging.disable(logging.WARNING)
    from megafmt.tokenizers import TokenizerOptions, load_tokenizer

    shutil.rmtree(WORKDIR, ignore_errors=True)
    WORKDIR.mkdir(parents=True)
    try:
        directory = WORKDIR / "tokenizer"
        rng = random.Random(0)
        write_tokenizer(directory, 4000, (code_text(rng, 200) for _ in range(2000)))
        text = load_tokenizer("huggingface", TokenizerOptions(model=str(directory)))
        prefix = str(WORKDIR / "code")
        texts = (code_text(rng, rng.randint(50, 2000)) for _ in range(args.documents))
        tokens = write_code_corpus(prefix, text, texts)
        count, length = args.samples, args.seq_length
        conditions = (
            f"{args.documents} code-like documents, {tokens:,} tokens, sequence length {length}, "
            f"fim_rate {FIM_FIELDS['fim_rate']}, fim_spm_rate {FIM_FIELDS['fim_spm_rate']}, "
            f"{count} samples, byte-level BPE"
        )
        report = benchreport.Report("fim", args.reference, args.rows)
        report.heading(f"FIM: {conditions}")
        plain = per_sample(
            ours(prefix, text, length, count, "GPTDataset", str(WORKDIR / "p")), 10 * count
        )
        fim = per_sample(
            ours(prefix, text, length, count, "GPTFIMDataset", str(WORKDIR / "f")), count
        )
        untouched = per_sample(
            ours(prefix, text, length, count, "GPTFIMDataset", str(WORKDIR / "z"), fim_rate=0.0),
            count,
        )
        timed = TimedTokenizer(text)
        timed_fim = ours(prefix, timed, length, count, "GPTFIMDataset", str(WORKDIR / "t"))
        timed.seconds = 0.0
        timed_total = per_sample(timed_fim, count) * count
        share = timed.seconds / timed_total
        with SeedProcess(paths=[SEEDSIDE]) as seed:
            fields = {
                **FIM_FIELDS,
                "random_seed": 1234,
                "sequence_length": length,
                "split": "100,0,0",
                "path_to_cache": str(WORKDIR / "s"),
            }
            theirs = seed.call(
                "seed_fim:time_samples",
                prefix,
                (str(directory), text.eod, IDENTIFIERS),
                count,
                fields,
                count,
            )
        state(
            report,
            {
                "plain GPTDataset (ours)": plain,
                "GPTFIMDataset (ours)": fim,
                "GPTFIMDataset (seed commit)": theirs,
                "GPTFIMDataset, fim_rate 0 (ours)": untouched,
            },
            share,
            conditions,
        )
    finally:
        shutil.rmtree(WORKDIR, ignore_errors=True)


if __name__ == "__main__":
    main()

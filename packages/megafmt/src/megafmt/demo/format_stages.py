"""megafmt's stages of the tour: the corpora, the tokenizer, preprocessing with verification,
and one sample (or document) decoded back to text."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy

from megafmt.dataset import IndexedDataset
from megafmt.demo.corpora import (
    iter_jsonl_texts,
    library_docstrings,
    reference_topics,
    train_tokenizer,
    write_jsonl,
)
from megafmt.demo.run import DemoCorpus, DemoRun
from megafmt.errors import MegafmtError
from megafmt.preprocess import PreprocessConfig, output_prefix_of, preprocess
from megafmt.protocols import TextTokenizer
from megafmt.tokenizers import TokenizerOptions, load_tokenizer
from megafmt.verification import verify

#: the default corpora's blend weights
DEFAULT_WEIGHTS = (0.6, 0.4)
#: the fewest characters of decoded text worth looking up in the corpus
SHORTEST_PROBE = 8


def _texts(run: DemoRun) -> Iterator[str]:
    """The documents of every corpus the tour preprocesses, streamed from their jsonl."""
    for corpus in run.corpora:
        if corpus.source is not None:
            yield from iter_jsonl_texts(corpus.source)


class CorporaStage:
    """Two corpora from the Python installation (or the user's own, as given)."""

    title = "two corpora of English text from the Python installation (or yours)"
    order = 10
    needs: Sequence[str] = ()

    def check(self, run: DemoRun) -> None:
        for corpus in run.corpora:
            if corpus.source is not None and not corpus.source.is_file():
                raise ValueError(f"--input {corpus.source}: expected a jsonl file, found none")

    def run(self, run: DemoRun) -> None:
        if not run.corpora:
            folder = run.settings.folder
            texts = {
                "topics": reference_topics(),
                "docstrings": library_docstrings(run.settings.docstrings),
            }
            for (name, documents), weight in zip(texts.items(), DEFAULT_WEIGHTS, strict=True):
                write_jsonl(folder / f"{name}.jsonl", documents)
                run.corpora.append(DemoCorpus(name, "", weight, source=folder / f"{name}.jsonl"))
        for corpus in run.corpora:
            if corpus.source is None:
                print(f"   {corpus.name}: the preprocessed corpus {corpus.prefix}")
                continue
            size = corpus.source.stat().st_size / 1e6
            print(f"   {corpus.name}: {corpus.source} ({size:.2f} MB of jsonl)")


class TokenizerStage:
    """A byte-level BPE tokenizer trained on the corpora, unless the user gave one."""

    title = "a byte-level BPE tokenizer trained on them (or yours)"
    order = 20
    needs: Sequence[str] = ("corpora",)

    def check(self, run: DemoRun) -> None:
        pass

    def run(self, run: DemoRun) -> None:
        if run.tokenizer_type is None:
            vocab_size = run.settings.vocab_size
            folder = train_tokenizer(_texts(run), run.settings.folder / "tokenizer", vocab_size)
            run.tokenizer_type = "HuggingFaceTokenizer"
            run.tokenizer_options = TokenizerOptions(model=str(folder))
            print(f"   trained a byte-level BPE of {vocab_size} tokens: {folder}")
        tokenizer = run.tokenizer = load_tokenizer(*run.tokenizer_flags())
        if tokenizer.eod is None:
            raise ValueError(
                f"--tokenizer-type {run.tokenizer_type}: the tour needs a tokenizer with an "
                "end-of-document token (documents are separated by it), found none"
            )
        run.eod = tokenizer.eod
        print(f"   {tokenizer.name}: vocabulary {tokenizer.vocab_size}, end of document {run.eod}")


class PreprocessStage:
    """``mega preprocess`` of each corpus given as text, then ``mega verify`` of every corpus."""

    title = "mega preprocess (progress bars) and mega verify"
    order = 30
    needs: Sequence[str] = ("tokenizer",)

    def check(self, run: DemoRun) -> None:
        pass

    def run(self, run: DemoRun) -> None:
        tokenizer_type, options = run.tokenizer_flags()
        for corpus in run.corpora:
            if corpus.source is not None:
                output = str(run.settings.folder / corpus.name)
                config = PreprocessConfig(
                    input=str(corpus.source),
                    output_prefix=output,
                    tokenizer_type=tokenizer_type,
                    tokenizer_options=options,
                    append_eod=True,
                    workers=max(1, run.settings.num_workers),
                )
                print(f"   mega preprocess {corpus.source} -> {output}")
                preprocess(config)
                corpus.prefix = output_prefix_of(output, "text", "document")
            given = "" if corpus.source is not None else "--data-path "
            try:
                problems = verify(corpus.prefix)
            except OSError as error:
                raise ValueError(f"{given}{corpus.prefix}: {error}") from error
            if problems:
                raise MegafmtError(f"mega verify {given}{corpus.prefix}: {problems[0]}")
            corpus.lengths = numpy.asarray(IndexedDataset(corpus.prefix).sequence_lengths)
            print(
                f"   mega verify {corpus.prefix}: well formed, {len(corpus.lengths)} documents, "
                f"{int(corpus.lengths.sum()):,} tokens"
            )
        run.facts.update(
            (f"corpus {c.name} (documents / tokens)", [len(c.lengths), int(c.lengths.sum())])
            for c in run.corpora
            if c.lengths is not None
        )


class DecodeStage:
    """The longest stretch between end-of-document tokens of the first sample read (or the
    first document, when no loader ran), back to text and looked up in the corpus text."""

    title = "one sample decoded back to text"
    order = 70
    needs: Sequence[str] = ("preprocess",)

    def check(self, run: DemoRun) -> None:
        pass

    def run(self, run: DemoRun) -> None:
        tokenizer = run.tokenizer
        if not isinstance(tokenizer, TextTokenizer):
            print(f"   the {tokenizer.name} tokenizer cannot turn ids into text: nothing decoded")
            return
        if run.batches and run.batches[0]:
            ids = numpy.asarray(run.batches[0][0]["tokens"])[0].tolist()
            where = "the first sample data-parallel rank 0 read"
        else:
            ids = IndexedDataset(run.corpora[0].prefix)[0].tolist()
            where = f"the first document of {run.corpora[0].name}"
        longest = max(_between(ids, run.eod), key=len)
        text = tokenizer.ids_to_text(longest)
        print(f"   {where}, its longest run of {len(longest)} tokens: {text[:300]!r}")
        if not any(corpus.source is not None for corpus in run.corpora):
            return  # preprocessed corpora only: no text to look it up in
        probe = text[2:-2]  # a window may cut a character at either end
        found = len(probe) >= SHORTEST_PROBE and any(probe in doc for doc in _texts(run))
        print(f"   found in the corpus text: {found}")
        run.checks["decoded sample is corpus text"] = found


def _between(ids: list[int], eod: int | None) -> list[list[int]]:
    """``ids`` cut at (and without) every end-of-document token."""
    pieces: list[list[int]] = [[]]
    for token in ids:
        if token == eod:
            pieces.append([])
        else:
            pieces[-1].append(token)
    return pieces

"""A blend's small GPT splits whose tables a writer thread of the build's background writes
builds and saves (megaindex.file_writes.TablesJob), beside the builder's own thread: the same
files as the tables built on the builder's thread, and the same outcome for a corpus touched,
replaced or refused while they build."""

import filecmp
import json
import os

import numpy
import pytest

from megafmt.testing import write_corpus
from megaindex import BlendedMegatronDatasetBuilder, CacheError, GPTDataset
from megaindex.cache import table_checksums
from megaindex.file_writes import (
    CHECKSUMS_MARK,
    FileWrite,
    TablesJob,
    TablesRefused,
    background_writes,
)
from megaindex.gpt_index import GPTTableRecipe
from megaindex.helpers import build_gpt_tables


def blend_of(tmp_path, count: int, seed: int) -> tuple[list[str], list[float]]:
    """``count`` corpora of 60..300 documents, weights spread over two orders of magnitude."""
    rng = numpy.random.default_rng(seed)
    tmp_path.mkdir()
    prefixes = [
        write_corpus(str(tmp_path / f"c{n}"), int(rng.integers(60, 300)), seed=seed * 100 + n)
        for n in range(count)
    ]
    return prefixes, [float(w) for w in numpy.exp(rng.uniform(0, 4.6, count))]


def build(make_config, cache: str, blend, sizes, **overrides):
    config = make_config(blend=blend, path_to_cache=cache, **overrides)
    return BlendedMegatronDatasetBuilder(GPTDataset, sizes, lambda: True, config).build()


def on_the_builders_thread(monkeypatch) -> None:
    """Every recipe builds its tables itself: no job for the writer."""
    monkeypatch.setattr(GPTTableRecipe, "writer_job", lambda self: None)


def jobs_handed(monkeypatch) -> list:
    """The jobs the recipes hand to the writer, recorded."""
    handed, hand = [], GPTTableRecipe.writer_job

    def recorded(self):
        job = hand(self)
        handed.append(job)
        return job

    monkeypatch.setattr(GPTTableRecipe, "writer_job", recorded)
    return handed


@pytest.mark.parametrize("seed", range(6))
def test_the_writers_tables_are_the_files_the_builders_thread_saves(
    make_config, tmp_path, monkeypatch, seed
):
    """Seeded blends, sequence lengths, splits and sizes (several epochs, the last apart or
    not, the extra token or not): every cache file the same, byte for byte, but the sidecar's
    record of the table files' identities; the samples the same."""
    rng = numpy.random.default_rng(seed)
    blend = blend_of(tmp_path / "corpora", int(rng.integers(2, 9)), seed)
    options = dict(
        sequence_length=int(rng.choice([8, 32, 100])),
        split=str(rng.choice(["100,0,0", "90,8,2", "60,30,10"])),
        add_extra_token_to_sequence=bool(rng.integers(2)),
        random_seed=int(rng.integers(0, 2**32)),
    )
    sizes = [int(rng.integers(50, 3000)), int(rng.integers(1, 60)), int(rng.integers(1, 30))]
    handed = jobs_handed(monkeypatch)
    by_writer = build(make_config, str(tmp_path / "writer"), blend, sizes, **options)
    assert any(job is not None for job in handed)
    monkeypatch.undo()
    on_the_builders_thread(monkeypatch)
    by_builder = build(make_config, str(tmp_path / "builder"), blend, sizes, **options)
    names = sorted(os.listdir(tmp_path / "builder"))
    assert sorted(os.listdir(tmp_path / "writer")) == names
    for name in names:
        ours, theirs = tmp_path / "writer" / name, tmp_path / "builder" / name
        if name.endswith(".json"):  # the same text up to the table files' identities
            texts = [path.read_text() for path in (ours, theirs)]
            cut = [text[: text.index(', "table_files": ')] for text in texts]
            assert cut[0] == cut[1], name
        else:
            assert filecmp.cmp(ours, theirs, shallow=False), name
    for ours, theirs in zip(by_writer, by_builder, strict=True):
        if theirs is not None:
            for i in range(0, len(theirs), max(1, len(theirs) // 7)):
                numpy.testing.assert_array_equal(ours[i]["tokens"], theirs[i]["tokens"])


def touched_once_handed(monkeypatch, action) -> None:
    """``action()`` once the first job was handed to the writer (its corpus opened before)."""
    hand = GPTTableRecipe.writer_job

    def handing(self):
        job = hand(self)
        if job is not None and not handing.done:
            handing.done = True
            action(self.corpus)
        return job

    handing.done = False
    monkeypatch.setattr(GPTTableRecipe, "writer_job", handing)


def bump_mtime(path: str) -> None:
    status = os.stat(path)
    os.utime(path, ns=(status.st_atime_ns, status.st_mtime_ns + 10**9))


def on_builder_threads(monkeypatch, threads: int) -> dict:
    """Build options: ``threads`` builder threads, every corpus sent to them (none built on the
    builder's own thread) when there are more than one."""
    from megaindex import builder

    if threads > 1:
        monkeypatch.setattr(builder, "SMALL_CORPUS_SAMPLES", 0)
    return {"num_dataset_builder_threads": threads}


@pytest.mark.parametrize("threads", [1, 2])
def test_a_corpus_touched_while_the_writer_builds_its_tables_is_cached(
    make_config, tmp_path, monkeypatch, threads
):
    """The writer's fingerprint finds the ``.idx`` touched since it was opened: the tables are
    cut again here, equal the writer's, and are saved with the files as they are now (as on
    the builder's thread, megaindex.tables.CachedTables); the next build is a cache hit. Also
    for corpora built on the builder threads (the mend waits for their datasets)."""
    options = on_builder_threads(monkeypatch, threads)
    blend = blend_of(tmp_path / "corpora", 3, 7)
    touched = []

    def touch(corpus: str) -> None:
        for suffix in (".idx", ".bin"):
            bump_mtime(corpus + suffix)
        touched.append(corpus)

    touched_once_handed(monkeypatch, touch)
    cache = str(tmp_path / "cache")
    train = build(make_config, cache, blend, [400, 0, 0], split="100,0,0", **options)[0]
    assert train.datasets[0].index_source.kind == "built"
    sidecar = next(
        json.loads((tmp_path / "cache" / name).read_text())
        for name in os.listdir(cache)
        if name.startswith(train.datasets[blend[0].index(touched[0])].unique_description_hash)
        and name.endswith("-megaindex.json")
    )
    assert sidecar["corpus_stat"]["idx"][1] == os.stat(touched[0] + ".idx").st_mtime_ns
    monkeypatch.undo()
    again = build(make_config, cache, blend, [400, 0, 0], split="100,0,0")[0]
    assert {part.index_source.kind for part in again.datasets} == {"cache"}
    for i in range(0, len(train), 37):
        numpy.testing.assert_array_equal(again[i]["tokens"], train[i]["tokens"])


def test_tables_cut_again_that_differ_from_the_writers_are_not_cached(
    make_config, tmp_path, monkeypatch
):
    """The mend compares the tables cut again with the writer's checksums: others (here, the
    writer's said to be other) fail the build naming the ``.idx``, and nothing is cached."""
    from megaindex.file_writes import Written

    blend = blend_of(tmp_path / "corpora", 3, 9)
    touched_once_handed(monkeypatch, lambda corpus: bump_mtime(corpus + ".idx"))
    monkeypatch.setattr(Written, "checksums", lambda self: {"document_index": "00000000"})
    cache = str(tmp_path / "cache")
    with pytest.raises(CacheError, match="the tables cut from it again differ"):
        build(make_config, cache, blend, [400, 0, 0], split="100,0,0")


def test_a_mended_entry_whose_files_are_gone_when_the_build_ends_fails_the_build(
    make_config, tmp_path, monkeypatch
):
    """A touched corpus's tables, mended and saved when the writes end, then removed (a
    cleanup of the cache folder): the build fails naming the folder, as for any file it wrote
    that is gone, not at the first read of the tables."""
    from megaindex.tables import CachedTables

    blend = blend_of(tmp_path / "corpora", 3, 10)
    touched_once_handed(monkeypatch, lambda corpus: bump_mtime(corpus + ".idx"))
    mend = CachedTables._mended

    def mended_then_removed(self, *arguments):
        outcome = mend(self, *arguments)
        if outcome is None:
            for name in self._cache.entry.tables:
                os.remove(self._cache.entry.table_path(name))
        return outcome

    monkeypatch.setattr(CachedTables, "_mended", mended_then_removed)
    cache = str(tmp_path / "cache")
    with pytest.raises(CacheError, match="went away while the build ran"):
        build(make_config, cache, blend, [400, 0, 0], split="100,0,0")


def test_a_corpus_replaced_while_the_writer_builds_its_tables_is_not_cached(
    make_config, tmp_path, monkeypatch
):
    """Replaced (another size and inode) after it was opened: the build fails naming the
    corpus, and its entry is not complete; the next build has the new corpus's tables."""
    blend = blend_of(tmp_path / "corpora", 3, 8)
    replacement = write_corpus(str(tmp_path / "replacement"), 150, seed=99)
    replaced = []

    def replace(corpus: str) -> None:
        for suffix in (".idx", ".bin"):
            os.replace(replacement + suffix, corpus + suffix)
        replaced.append(corpus)

    touched_once_handed(monkeypatch, replace)
    cache = str(tmp_path / "cache")
    with pytest.raises(CacheError, match="the corpus's files changed while its index tables"):
        build(make_config, cache, blend, [400, 0, 0], split="100,0,0")
    monkeypatch.undo()
    train = build(make_config, cache, blend, [400, 0, 0], split="100,0,0")[0]
    part = train.datasets[blend[0].index(replaced[0])]
    assert len(part.dataset.sequence_lengths) == 150
    on_the_builders_thread(monkeypatch)
    local = build(make_config, str(tmp_path / "local"), blend, [400, 0, 0], split="100,0,0")[0]
    numpy.testing.assert_array_equal(
        part.document_index, local.datasets[blend[0].index(replaced[0])].document_index
    )


TABLES = ("document_index", "sample_index", "shuffle_index")


def sidecar_taking_checksums(folder) -> FileWrite:
    """A TablesJob's fourth file: its tables' checksums, then the identities of their files."""
    return FileWrite(
        str(folder / "sidecar.json"),
        b'{"checksums": ' + CHECKSUMS_MARK + b', "table_files": ',
        tuple((json.dumps(name), n) for n, name in enumerate(TABLES)),
        "}",
    )


def test_a_write_that_builds_its_tables_writes_them_and_their_checksums(tmp_path):
    """The files of a TablesJob: each table as numpy.save writes build_gpt_tables's, the
    sidecar with their checksums where the mark was; its checksums() say the same."""
    import io

    sizes = numpy.array([5, 9, 3, 12, 7, 4], dtype=numpy.int32)
    documents = numpy.arange(6, dtype=numpy.int32)
    tables = build_gpt_tables(sizes, documents, 2, False, 77, 8, int(sizes.sum()))
    names = TABLES
    saved = []  # each table's file as numpy.save writes it
    for table in tables:
        buffer = io.BytesIO()
        numpy.save(buffer, table)
        saved.append(buffer.getvalue())
    files = [  # the headers: the writer appends the tables it builds
        FileWrite(str(tmp_path / f"{name}.npy"), whole[: len(whole) - table.nbytes])
        for name, whole, table in zip(names, saved, tables, strict=True)
    ]
    files.append(sidecar_taking_checksums(tmp_path))
    job = TablesJob(
        sizes, documents, 2, False, 77, 8, 1, len(tables[2]), len(tables[2]),
        False, False, sum(t.nbytes for t in tables),
    )  # fmt: skip
    with background_writes() as writes:
        written = writes.submit(files, lambda: None, lambda error: error, job)
    for name, whole in zip(names, saved, strict=True):
        assert (tmp_path / f"{name}.npy").read_bytes() == whole
    recorded = json.loads((tmp_path / "sidecar.json").read_text())
    expected = table_checksums(dict(zip(names, tables, strict=True)))
    assert recorded["checksums"] == expected == written.checksums()
    assert len(written.identities()) == 4


def test_a_write_whose_tables_walk_is_refused_writes_nothing(tmp_path):
    """A document the walk cannot read (an id past the lengths): the walk is refused
    (TablesRefused, naming the sample index), and no file is written."""
    sizes = numpy.array([5, 9], dtype=numpy.int32)
    documents = numpy.array([0, 7], dtype=numpy.int32)
    names = TABLES
    files = [FileWrite(str(tmp_path / f"{name}.npy"), b"") for name in names]
    files.append(sidecar_taking_checksums(tmp_path))
    job = TablesJob(sizes, documents, 1, False, 1, 4, 1, 3, 3, False, False, 0)
    with pytest.raises(TablesRefused) as refused, background_writes() as writes:
        written = writes.submit(files, lambda: None, lambda error: error, job)
    assert refused.value.filename == str(tmp_path / "sample_index.npy")
    assert os.listdir(tmp_path) == [] and written.checksums() == {}

"""A dataset's index tables: loaded from the shared cache or built (and cached) once.

``GPTDataset`` (three tables) and ``BlendedDataset`` (two) hold their tables in one of these.
What the tables are made of is the dataset's :class:`TableRecipe`; how they are kept is the
same for both:

* ``path_to_cache`` unset (and no default place): built in memory (the dataset logs
  megatron-core's warning).
* ``defer_npy_index_mmap``: nothing is read until a table is first used, then the cached files
  are mapped (megatron-core's lazy mode); the dataset's length comes from the recipe meanwhile.
* ``fast_cache_load``: the cached files are mapped without any check, the tables' checksums
  included (megatron-core trusts them there too).
* otherwise: the cache is loaded after its checks (the description, each table's dtype and
  shape, and where the recipe fingerprints its inputs, that they did not change since the
  build and that each table's bytes still have the checksum recorded when it was saved; the
  last two read nothing for files that are the very ones saved, or that this machine verified
  before, :mod:`megaindex.verified`), or built on global rank 0 and saved (see
  :func:`megaindex.cache.load_or_build`); a damaged or stale cache is rebuilt with a warning,
  or refused with ``stale_cache="error"``. Tables whose files need no read to be trusted (just
  saved, or the very files recorded) are mapped when first read
  (:class:`megaindex.cache.MappedOnUse`): a blend of thousands of corpora maps what it reads.

``source`` says which of these happened, with timings, for ``mega index build`` and the logs.
"""

from __future__ import annotations

import errno
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, TypeVar, runtime_checkable

import numpy

from megafmt.checked import one_checker
from megafmt.fingerprint import corpus_fingerprint, corpus_stat, fingerprint_changes
from megafmt.protocols import conforms
from megafmt.readers import is_url
from megafmt.redaction import redact
from megaindex import distributed
from megaindex.cache import (
    SIDE_BY_SIDE_BYTES,
    CacheEntry,
    DamagedCacheError,
    IndexCache,
    MappedOnUse,
    TableSpec,
    changed_tables,
    check_checksums,
    load_or_build,
    recorded_specs,
    specs_from_sidecar,
    specs_of,
    table_checksums,
    table_specs,
)
from megaindex.errors import (
    CacheError,
    ConfigError,
    IndexBuildError,
    MissingCacheError,
    StaleCacheError,
)
from megaindex.file_writes import CorpusFiles, TablesJob, TablesRefused, Written, current
from megaindex.memory import reserving
from megaindex.shared_cache import SharedCacheConfig, SharedTableCache
from megaindex.verified import NOTES, cache_identity, remember_verified, was_verified

Result = TypeVar("Result")


@dataclass
class TableSource:
    """Where a dataset's tables came from: ``"cache"``, ``"built"`` (and cached), ``"memory"``
    (built, not cached) or ``"deferred"`` (mapped on first use); with timings in seconds."""

    kind: str
    cache_entry: CacheEntry | None
    seconds: dict[str, float] = field(default_factory=dict)


@runtime_checkable
class IndexSourced(Protocol):
    """A dataset that says where its index tables came from (GPTDataset and its kin)."""

    @property
    def index_source(self) -> TableSource: ...


@dataclass
class BuiltTables:
    """Freshly built tables, the seconds each took, and notes kept in the cache's sidecar
    (GPTDataset's epoch plan)."""

    tables: dict[str, numpy.ndarray]
    seconds: dict[str, float] = field(default_factory=dict)
    notes: dict[str, Any] = field(default_factory=dict)


@dataclass
class WriterTables:
    """Tables handed to the build's background writes, to be built by a writer thread
    (:class:`~megaindex.file_writes.TablesJob`): the job, the notes kept in the sidecar, and
    the dtype and shape of each table."""

    job: TablesJob
    notes: dict[str, Any]
    specs: dict[str, TableSpec]


@runtime_checkable
class WriterBuilt(Protocol):
    """A recipe whose tables a writer thread of the build's background writes can build
    (GPTDataset's small splits)."""

    def writer_job(self) -> WriterTables | None:
        """The tables as such a job, where these can be (else None: built by the recipe)."""
        ...


class TableRecipe(Protocol):
    """What a dataset's tables are made of."""

    names: tuple[str, ...]
    """The tables, in the order the dataset hands them out."""

    def build(self) -> BuiltTables:
        """Build every table. A recipe that reads a corpus (``corpus`` set) is a dataclass
        whose copy (``dataclasses.replace``) reads it again, nothing of an earlier build kept:
        tables cut while the corpus's ``.idx`` was written in place are cut again so."""
        ...

    def expected_specs(self) -> dict[str, TableSpec]:
        """The dtype and shape each table must have, computed from the inputs."""
        ...

    def bytes_to_hold(self) -> dict[str, int]:
        """The bytes a build allocates for each table, held (:func:`megaindex.memory.reserving`)
        while it builds: those of ``expected_specs``, less tables allocated and held already
        (a blend's indices drawn in advance)."""
        ...

    corpus: str | None
    """The corpus the tables are cut from, fingerprinted in the cache's sidecar (None: none)."""

    opened_stat: dict[str, list[int]] | None
    """That corpus's files as they were opened (:func:`megafmt.fingerprint.corpus_stat`; None:
    not known), recorded in the sidecar: a corpus replaced while its tables build is not
    cached under the replacement's fingerprint."""

    opened_versions: dict[str, int | str] | None
    """For a corpus in object storage, its objects' sizes and ETags as opened (None: not known):
    one replaced in the store while its tables build is not cached under the replacement's."""

    def settings(self) -> dict[str, Any] | None:
        """The settings the tables depend on that the cache key leaves out, recorded in the
        sidecar and compared at load; None: no sidecar (the shapes are checked instead)."""
        ...

    where: str
    """The dataset the tables belong to, for errors."""

    def sizing(self) -> str:
        """The settings (with their values) that set the tables' sizes, for an error when they
        do not fit in memory."""
        ...


def _check_store_as_opened(
    corpus: str, opened: Mapping[str, Any] | None, now: Mapping[str, Any] | None
) -> None:
    """Raise :class:`~megaindex.errors.CacheError` where the objects of ``corpus`` (in object
    storage) are ``now`` other versions than the ``opened`` ones its tables were cut from (None:
    not known, not checked): cached under the replacement's ETags, they would be taken for the
    new corpus's by every later run."""
    if opened is None or now is None or dict(now) == dict(opened):
        return
    raise CacheError(
        f"{redact(corpus)}: the corpus changed in the store while its index tables were built: "
        f"opened as .idx {opened.get('idx_bytes')} bytes ETag {opened.get('idx_hash')}, .bin "
        f"{opened.get('bin_bytes')} bytes ETag {opened.get('bin_hash')}; now .idx "
        f"{now.get('idx_bytes')} bytes ETag {now.get('idx_hash')}, .bin {now.get('bin_bytes')} "
        f"bytes ETag {now.get('bin_hash')}. The tables are not cached: build again once the "
        "corpus is complete"
    )


class CachedTables:
    """The tables of one dataset, by name (``tables["sample_index"]``)."""

    def __init__(
        self,
        recipe: TableRecipe,
        entry: CacheEntry | None,
        description: str,
        *,
        defer: bool = False,
        fast_load: bool = False,
        stale_cache: str = "rebuild",
    ) -> None:
        self.recipe = recipe
        self.stale_cache = stale_cache
        self._tables: Mapping[str, numpy.ndarray] | None = None
        self._notes: dict[str, Any] = {}
        # taken while the tables build, or by the writer of the cache's files (CorpusFiles)
        self._corpus_fingerprint: dict[str, Any] | CorpusFiles | None = None
        # the corpus's files as its tables were cut again from them (an .idx touched while they
        # built), recorded in the sidecar; None: as the corpus was opened
        self._cut_again_from: dict[str, list[int]] | None = None
        self._cache = None if entry is None else IndexCache(entry, description)
        if defer:
            if entry is None:
                raise ConfigError(
                    "defer_npy_index_mmap maps cached tables, but this dataset has no cache "
                    "directory: set path_to_cache"
                )
            self.source = TableSource("deferred", entry)
        elif entry is None:
            self.source = TableSource("memory", None)  # the dataset logs megatron-core's warning
            self._tables = self._build()
        elif fast_load:
            self.source = TableSource("cache", entry)
            self._tables = self._through_shared(lambda: self._map_trusted("fast_cache_load"))
        else:
            self.source = TableSource("cache", entry)
            self._tables, self.source.kind = self._through_shared(
                lambda: load_or_build(
                    self._cache,
                    self._load_checked,
                    self._build,
                    self._sidecar,
                    self.source.seconds,
                    self._built_by_writer,
                ),
                rebuilt=lambda result: result[1] == "built",
            )

    def _through_shared(
        self,
        load_or_build: Callable[[], Result],
        may_build: bool | None = None,
        rebuilt: Callable[[Result], bool] = lambda result: False,
    ) -> Result:
        """``load_or_build()``; with a shared store (:mod:`megaindex.shared_cache`), after the
        node's copy was downloaded, or built under the job's lease and uploaded (where
        ``may_build``; None: where this process builds shared files). ``rebuilt`` says of a
        result whether it rebuilt the node's copy (stale or damaged): the store's is replaced."""
        entry = self._cache.entry
        if entry.remote is None:
            return load_or_build()
        shared = SharedTableCache(SharedCacheConfig.from_environment(entry.remote))
        start = time.perf_counter()
        if may_build is None:
            may_build = distributed.builds_shared_files()
        result = shared.obtain(entry, self._cache.description, load_or_build, may_build, rebuilt)
        self.source.seconds["shared"] = time.perf_counter() - start
        return result

    @property
    def deferred(self) -> bool:
        """Whether the tables are deferred and not used yet (megatron-core's lazy mode)."""
        return self._tables is None and self.source.kind == "deferred"

    def get(self, name: str) -> numpy.ndarray | None:
        """Table ``name``, or None while the tables are deferred and unused (megatron-core's
        attributes are None until a sample is read)."""
        return None if self.deferred else self[name]

    def __getitem__(self, name: str) -> numpy.ndarray:
        tables = self._tables
        if tables is None:  # deferred, or unpickled: map the cached files now (a shared store's
            # downloaded first where the node has none; mapping never builds)
            deferred = self.source.kind == "deferred"
            who = "defer_npy_index_mmap" if deferred else "a copy of the dataset (unpickled)"
            tables = self._tables = self._through_shared(lambda: self._map_trusted(who), False)
        return tables[name]

    def shape(self, name: str) -> tuple[int, ...]:
        """Table ``name``'s shape; a table mapped when first read is not mapped for it."""
        tables = self._tables
        return tables.shape(name) if isinstance(tables, MappedOnUse) else self[name].shape

    def _map_trusted(self, who: str) -> dict[str, numpy.ndarray]:
        """The cached tables, mapped without checks (``who`` trusts them: megatron-core's
        fast and deferred modes, or a worker's copy of checked tables); a missing or unreadable
        file is a :class:`MissingCacheError`."""
        try:
            return self._cache.load(None, check=False)
        except DamagedCacheError as error:
            raise MissingCacheError(
                f"{error}: {who} maps the index cache without building it, and the tables "
                f"{self._cache.entry.base} are not usable in {self._cache.entry.directory}; "
                "build the cache once without fast_cache_load and defer_npy_index_mmap (same "
                "configuration) first"
            ) from None

    def __getstate__(self) -> dict[str, Any]:
        # cached tables travel to DataLoader workers as their files, mapped there on first use
        # (checked here already); tables built in memory travel as they are
        state = dict(self.__dict__)
        if self._cache is not None:
            state["_tables"] = None
        return state

    def _build(self) -> dict[str, numpy.ndarray]:
        recipe = self.recipe
        try:
            sizes, sizing = recipe.bytes_to_hold(), recipe.sizing()
        except ValueError:  # inputs the build refuses itself, with its own message
            sizes, sizing = {}, ""
        with reserving(recipe.where, sizes, sizing):
            return self._build_within(sizes)

    def _build_within(self, sizes: Mapping[str, int]) -> dict[str, numpy.ndarray]:
        """:meth:`_build` once the tables' memory is held."""
        recipe = self.recipe
        corpus = recipe.corpus if self._cache is not None else None
        # a local corpus's files, fingerprinted only where they are still those opened
        local = corpus is not None and not is_url(corpus)
        files = CorpusFiles(corpus, recipe.opened_stat) if local else None
        fingerprint = None
        if sum(sizes.values()) < SIDE_BY_SIDE_BYTES:  # small: one after the other
            built = recipe.build()
        else:  # the sidecar's fingerprint of the corpus (a pass over its .idx) meanwhile
            with ThreadPoolExecutor(1, thread_name_prefix="megaindex-fingerprint") as pool:
                taken = None
                if files is not None:
                    taken = pool.submit(files.unchecked_fingerprint)
                elif corpus is not None:
                    taken = pool.submit(corpus_fingerprint, corpus)
                built = recipe.build()
                fingerprint = None if taken is None else taken.result()
        if files is not None:
            built, files, rebuilt = self._cut_from_files_now(built, files)
            if fingerprint is None:
                fingerprint = files  # taken by the cache's writer, which checks the files again
            elif rebuilt:  # taken beside the first cut: again, from the files cut again
                fingerprint = files.fingerprint()
        elif corpus is not None and fingerprint is None:
            fingerprint = corpus_fingerprint(corpus)
        if not local and corpus is not None:
            _check_store_as_opened(corpus, recipe.opened_versions, fingerprint)
        self._corpus_fingerprint = fingerprint
        self.source.seconds.update(built.seconds)
        self._notes = built.notes
        return built.tables

    def _built_by_writer(self) -> MappedOnUse | None:
        """The tables handed to the build's background writes, built and saved by a writer
        thread while this one goes on (:class:`WriterBuilt`): a local corpus's small split,
        its files fingerprinted by the writer as the tables' are; mapped when first read. None
        where the recipe builds them here (outside a build's background writes too)."""
        recipe = self.recipe
        corpus, settings = recipe.corpus, recipe.settings()
        entry = self._cache.entry
        if corpus is None or is_url(corpus) or settings is None or entry.remote is not None:
            return None
        if current() is None or not conforms(recipe, WriterBuilt):
            return None
        handed = recipe.writer_job()
        if handed is None:
            return None
        self._corpus_fingerprint = CorpusFiles(corpus, recipe.opened_stat)
        self._notes = handed.notes
        sidecar = self._record(recorded_specs(handed.specs), None)
        start = time.perf_counter()
        handed_over: list[Written] = []  # the write, once submitted (a mend reads it)
        written = self._cache.save_built_by_writer(
            handed.job,
            handed.specs,
            sidecar,
            lambda error, worded: self._mended(error, worded, sidecar["tables"], handed_over),
        )
        handed_over.append(written)
        self.source.seconds["save"] = time.perf_counter() - start
        return MappedOnUse(
            entry,
            handed.specs,
            lambda: dict(zip(entry.tables, written.identities(), strict=False)),
            written.checksums,
        )

    def _mended(
        self,
        error: OSError,
        worded: Callable[[OSError], Exception],
        specs: dict[str, Any],
        handed_over: list[Written],
    ) -> Exception | None:
        """The failure of tables a writer built (:meth:`_built_by_writer`) as the build raises
        it; None where it is mended: an ``.idx`` only touched since it was opened (the
        writer's fingerprint refused it) has the tables cut again here, which must equal the
        writer's (``handed_over[0]``'s checksums), and saved now with the files as they are.
        That mend runs once the build's writes end, every dataset made."""
        recipe = self.recipe
        if isinstance(error, TablesRefused):
            return IndexBuildError(
                f"{recipe.where}: the walk of the index tables was refused: a document id "
                "outside the corpus's lengths, or the stream ends with an empty document"
            )
        files = CorpusFiles(recipe.corpus, recipe.opened_stat)
        if error.errno != errno.ESTALE or files.opened is None:
            return worded(error)
        try:
            now = self._corpus_now(files)
            if not files.idx_written(now):  # another change: worded as the writer found it
                return worded(error)
            again = self._cut_again((specs, handed_over[0].checksums()), files, now)
            self._corpus_fingerprint = CorpusFiles(files.prefix, now)
            record = self._sidecar(again.tables)
            identities = self._cache.save(again.tables, record, background=False)
        except CacheError as refused:  # the corpus changed, or the save failed
            return refused
        self._tables = MappedOnUse(
            self._cache.entry, specs_of(again.tables), identities, record["checksums"]
        )
        return None

    @staticmethod
    def _corpus_now(files: CorpusFiles) -> dict[str, list[int]]:
        """The corpus's files as they are now (:func:`megafmt.fingerprint.corpus_stat`); gone is
        a :class:`~megaindex.errors.CacheError`."""
        try:
            return corpus_stat(files.prefix)
        except OSError as error:
            raise CacheError(
                f"{files.prefix}: the corpus's files went away while its index tables were "
                f"built ({error}); the tables are not cached"
            ) from None

    def _cut_from_files_now(
        self, built: BuiltTables, files: CorpusFiles
    ) -> tuple[BuiltTables, CorpusFiles, bool]:
        """``built``, checked against the corpus's files as they are now: replaced (another
        size or inode) or gone is a :class:`~megaindex.errors.CacheError`; an ``.idx`` written
        in place (another modification time: rewritten, or only touched) has its tables cut
        again from it, which must equal ``built`` (a touch passes, with the files as they are
        now; other tables are a CacheError: the corpus changed under the build). Returns the
        tables, the files they were cut from, and whether they were cut again."""
        if files.opened is None:  # not known: not checked
            return built, files, False
        now = self._corpus_now(files)
        if not files.idx_written(now):
            return built, files, False
        # the first tables by their dtypes, shapes and checksums, let go of before the second
        # cut: held both, a large corpus's tables would take twice the memory reserved
        first = (table_specs(built.tables), table_checksums(built.tables))
        built.tables.clear()
        again = self._cut_again(first, files, now)
        return again, CorpusFiles(files.prefix, now), True

    def _cut_again(
        self,
        first: tuple[dict[str, Any], dict[str, str]],
        files: CorpusFiles,
        now: dict[str, list[int]],
    ) -> BuiltTables:
        """The tables cut again from the corpus's ``.idx``, written in place since it was
        opened (the files ``now``): they must equal those cut ``first`` (their dtypes and
        shapes, and checksums), else the corpus changed under the build (a
        :class:`~megaindex.errors.CacheError`)."""
        try:
            again = replace(self.recipe).build()  # a copy: nothing of the first read kept
        except (IndexBuildError, OSError) as error:
            raise CacheError(
                f"{files.idx_written_message(now)}, and cutting its tables again failed "
                f"({error}); the tables are not cached. Build again once the corpus is complete"
            ) from error
        if (table_specs(again.tables), table_checksums(again.tables)) != first:
            raise CacheError(
                f"{files.idx_written_message(now)}, and the tables cut from it again differ "
                "from those cut first (the corpus changed under the build); the tables are not "
                "cached. Build again once the corpus is complete"
            )
        self._cut_again_from = now
        return again

    def _sidecar(self, tables: Mapping[str, numpy.ndarray]) -> dict[str, Any] | None:
        return self._record(table_specs(tables), table_checksums(tables))

    def _record(
        self, specs: dict[str, dict[str, Any]], checksums: dict[str, str] | None
    ) -> dict[str, Any] | None:
        """The sidecar of tables of ``specs`` (as recorded) and ``checksums`` (None: left out,
        for the writer that builds the tables to add); None where the recipe keeps none."""
        settings = self.recipe.settings()
        if settings is None:
            return None
        corpus = self.recipe.corpus
        record = {
            "corpus": None if corpus is None else self._corpus_fingerprint,
            "corpus_stat": self._cut_again_from or self._corpus_stat(),
            "config": settings,
            **self._notes,
            "tables": specs,
        }
        if checksums is not None:
            record["checksums"] = checksums
        return record

    def _load_checked(self) -> Mapping[str, numpy.ndarray]:
        """The cached tables, after checking that they fit the inputs."""
        cache = self._cache
        settings = self.recipe.settings()
        sidecar = None if settings is None else cache.read_sidecar()
        if sidecar is None:  # nothing recorded, or built by megatron-core: check the shapes
            return cache.load(self.recipe.expected_specs())
        entry = cache.entry
        if self._corpus_as_recorded(sidecar) and not changed_tables(entry, sidecar):
            # the very files saved: the checks that read them have nothing to read
            return self._load_recorded(sidecar, settings, True, None, 0)
        taken = time.time_ns()
        identity = cache_identity(entry, self.recipe.corpus)
        if identity is None:  # nothing to note (a corpus in object storage): no one to wait for
            return self._load_recorded(sidecar, settings, False, None, taken)
        if was_verified(entry, identity):
            return self._load_recorded(sidecar, settings, True, identity, taken)
        # processes loading it at once (the ranks of a node) verify it one at a time: the first
        # reads the files and notes them, the others find its note
        with one_checker(entry.sidecar_path, NOTES):
            verified = was_verified(entry, identity)
            return self._load_recorded(sidecar, settings, verified, identity, taken)

    def _load_recorded(
        self,
        sidecar: Mapping[str, Any],
        settings: dict[str, Any],
        verified: bool,
        identity: dict[str, Any] | None,
        taken_ns: int,
    ) -> Mapping[str, numpy.ndarray]:
        """The tables of a cache with a sidecar, after comparing the corpus and settings with
        what it recorded and each table with its checksum. ``verified``: the files are the very
        ones saved, or ones this machine verified, and neither check reads them (nor are they
        mapped before they are read); else both run and ``identity`` (taken at ``taken_ns``) is
        noted once they pass."""
        cache = self._cache
        changes = self._changes(sidecar, settings, verified)
        if changes:
            what = f"{cache.entry.sidecar_path}: the cache was built from other data: " + "; ".join(
                changes
            )
            if self.stale_cache == "error":
                raise StaleCacheError(
                    f"{what}. Delete the cache, or set stale_cache='rebuild' to rebuild it"
                )
            raise DamagedCacheError(what)
        if verified:  # nothing to read: each table is mapped when first read
            return cache.map_on_use(sidecar)
        tables = cache.load(specs_from_sidecar(sidecar))
        if not verified:
            start = time.perf_counter()
            check_checksums(cache.entry, tables, sidecar)
            self.source.seconds["checksums"] = time.perf_counter() - start
            remember_verified(cache.entry, identity, taken_ns)
        return tables

    def _corpus_stat(self) -> dict[str, list[int]] | None:
        """The corpus's files as the tables read them: as opened, where the recipe knows it,
        else as the path holds them now (two ``stat`` calls; None: no corpus)."""
        recipe = self.recipe
        if recipe.corpus is None:
            return None
        opened = recipe.opened_stat
        return corpus_stat(recipe.corpus) if opened is None else opened

    def _corpus_as_recorded(self, sidecar: Mapping[str, Any]) -> bool:
        """Whether the corpus files have the stats the sidecar recorded."""
        return sidecar.get("corpus_stat") == self._corpus_stat()

    def _changes(
        self, sidecar: Mapping[str, Any], settings: dict[str, Any], verified: bool
    ) -> list[str]:
        """How the corpus and settings differ from those the sidecar recorded (empty: not).
        The corpus is taken as recorded when the cache is ``verified`` (:meth:`_load_recorded`)."""
        if (verified or self._corpus_as_recorded(sidecar)) and sidecar.get("config") == settings:
            return []  # the same files (two stat calls, or a note) and the same settings
        # other stats: hash the contents (a copy of the same corpus is fine)
        corpus = self.recipe.corpus
        current = {
            "corpus": None if corpus is None else corpus_fingerprint(corpus),
            "config": settings,
        }
        return fingerprint_changes(_flatten(sidecar), _flatten(current))


def _flatten(fingerprint: Mapping[str, Any]) -> dict[str, Any]:
    """The ``corpus`` and ``config`` sections as ``{"corpus.x": ..., "config.y": ...}``."""
    return {
        f"{section}.{key}": value
        for section in ("corpus", "config")
        for key, value in (fingerprint.get(section) or {}).items()
    }

"""Megatron-LM at the seed commit e03878b5f, run as the reference in a process of its own.

The seed commit's ``megatron`` package and megatron-core 0.16.1 (installed in the test venv)
share the name ``megatron``, so the two cannot live in one interpreter. ``SeedProcess`` starts
a worker with the seed commit's source first on ``sys.path``; a test asks it to call a function
of a module (a module of its own, placed on the worker's path) and gets the result back by
pickle, or the exception the seed code raised (its class names along the MRO, its message and
its traceback), so a test compares both *what* is built and *whether* it is built.

The source comes from ``../shared/reference/megatron-lm-e03878b5f.tar.gz`` (or the archive
``MEGATRON_SEED_ARCHIVE`` names) and is extracted once into ``build/seed/`` under a lock. The
environment fixes ``../shared/reference/README.md`` lists are applied in the worker, and only
there:

- ``megatron.core.transformer.moe.ops.paged_stash`` needs triton (GPU only): a stub module with
  its three names, each raising if called;
- ``typing.override`` (Python 3.12) is set to 3.12's marker decorator on 3.11;
- ``megatron/core/datasets/helpers_cpp`` (compiled by ``make`` at run time) is taken from the
  installed megatron-core 0.16.1 wheel, after checking that the two ``helpers.cpp`` are
  byte-identical.

Test support, not part of any package (pytest puts this folder on ``sys.path``).
"""

from __future__ import annotations

import fcntl
import importlib.metadata
import os
import pickle
import select
import shutil
import struct
import subprocess
import sys
import tarfile
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
SEED_COMMIT = "e03878b5f"
SOURCE_NAME = f"megatron-lm-{SEED_COMMIT}"
DEFAULT_ARCHIVE = REPO_ROOT.parent / "shared" / "reference" / f"{SOURCE_NAME}.tar.gz"
EXTRACT_ROOT = REPO_ROOT / "build" / "seed"


#: set (to 1) where a missing archive must fail the tests that need it instead of skipping them:
#: CI, which always has it
REQUIRE_SEED_VARIABLE = "MEGA_REQUIRE_SEED"


class SeedReferenceMissing(RuntimeError):
    """The seed commit's code cannot be run here: its archive, or what its environment needs."""


class SeedArchiveMissing(SeedReferenceMissing):
    """The seed commit's source archive is not where the harness looks for it."""


class SeedRaised(Exception):
    """The seed commit's code raised: ``classes`` are its exception's MRO names, outermost
    first (``["AssertionError", "Exception", ...]``)."""

    def __init__(self, classes: list[str], message: str, traceback_text: str) -> None:
        super().__init__(f"{classes[0]}: {message}\n--- seed traceback ---\n{traceback_text}")
        self.classes = classes
        self.message = message
        self.traceback_text = traceback_text

    def is_a(self, name: str) -> bool:
        return name in self.classes


def archive_path() -> Path:
    path = Path(os.environ.get("MEGATRON_SEED_ARCHIVE", DEFAULT_ARCHIVE))
    if not path.is_file():
        raise SeedArchiveMissing(missing_archive_message(path))
    return path


def missing_archive_message(path: Path) -> str:
    return (
        f"the seed commit's source archive {path} does not exist; set MEGATRON_SEED_ARCHIVE "
        f"to {SOURCE_NAME}.tar.gz (Megatron-LM at commit {SEED_COMMIT})"
    )


def seed_unavailable() -> str | None:
    """Why the seed commit's code cannot run here (its archive is missing), or None when it can.
    Where ``MEGA_REQUIRE_SEED`` is set the answer is always None, so whatever needs the seed
    runs and fails loudly."""
    if os.environ.get(REQUIRE_SEED_VARIABLE):
        return None
    try:
        archive_path()
    except SeedArchiveMissing as missing:
        return str(missing)
    return None


def _installed_helpers() -> tuple[Path, Path]:
    """megatron-core 0.16.1's ``helpers.cpp`` and its prebuilt ``helpers_cpp`` extension."""
    files = importlib.metadata.files("megatron-core") or []
    found: dict[str, Path] = {}
    for entry in files:
        name = str(entry)
        if name.startswith("megatron/core/datasets/helpers"):
            if name.endswith("helpers.cpp"):
                found["source"] = Path(entry.locate())
            elif name.endswith(".so") and "helpers_cpp" in name:
                found["extension"] = Path(entry.locate())
    if set(found) != {"source", "extension"}:
        raise SeedReferenceMissing(
            "megatron-core 0.16.1's helpers.cpp and prebuilt helpers_cpp are not installed here; "
            f"found {sorted(found)}"
        )
    return found["source"], found["extension"]


def source_root() -> Path:
    """The extracted seed source (extracted once; concurrent callers wait on a lock)."""
    root = EXTRACT_ROOT / SOURCE_NAME
    done = EXTRACT_ROOT / f"{SOURCE_NAME}.ready"
    if done.exists():
        return root
    EXTRACT_ROOT.mkdir(parents=True, exist_ok=True)
    with open(EXTRACT_ROOT / f"{SOURCE_NAME}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if done.exists():
            return root
        staging = EXTRACT_ROOT / f"{SOURCE_NAME}.staging"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        with tarfile.open(archive_path()) as archive:
            archive.extractall(staging, filter="data")
        extracted = staging / SOURCE_NAME
        if not extracted.is_dir():
            raise SeedReferenceMissing(f"{archive_path()} holds no {SOURCE_NAME}/ folder")
        datasets = extracted / "megatron" / "core" / "datasets"
        source, extension = _installed_helpers()
        if (datasets / "helpers.cpp").read_bytes() != source.read_bytes():
            raise SeedReferenceMissing(
                f"{datasets / 'helpers.cpp'} differs from megatron-core's {source}: its prebuilt "
                "helpers_cpp cannot stand in for the seed commit's"
            )
        shutil.copy2(extension, datasets / extension.name)
        shutil.rmtree(root, ignore_errors=True)
        extracted.rename(root)
        shutil.rmtree(staging, ignore_errors=True)
        done.touch()
    return root


def _write_frame(stream: Any, payload: bytes) -> None:
    stream.write(struct.pack("<Q", len(payload)))
    stream.write(payload)
    stream.flush()


def _read_exact(stream: Any, size: int) -> bytes:
    chunks = []
    while size:
        chunk = stream.read(size)
        if not chunk:
            raise EOFError("the seed worker closed its pipe")
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def _read_frame(stream: Any) -> bytes:
    (size,) = struct.unpack("<Q", _read_exact(stream, 8))
    return _read_exact(stream, size)


class SeedProcess:
    """A worker process running the seed commit's code; ``call`` runs one function there.

    ``paths`` are folders put on the worker's ``sys.path`` after the seed source, where the
    modules a test calls into live. ``env`` adds environment variables for the worker.
    """

    def __init__(
        self,
        paths: Sequence[str | os.PathLike] = (),
        env: dict[str, str] | None = None,
        timeout: float = 600.0,
    ) -> None:
        self.root = source_root()
        self.timeout = timeout
        worker_env = dict(os.environ)
        worker_env.update(env or {})
        worker_env["SEEDREF_PATHS"] = os.pathsep.join(
            [str(self.root), *(str(Path(p).resolve()) for p in paths)]
        )
        self._process = subprocess.Popen(
            [sys.executable, "-u", str(Path(__file__).resolve()), "--worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=worker_env,
            cwd=str(REPO_ROOT),
        )

    def call(self, target: str, *args: Any, **kwargs: Any) -> Any:
        """Run ``module:function(*args, **kwargs)`` in the worker; raise ``SeedRaised`` when
        the seed code raised."""
        assert self._process.stdin is not None and self._process.stdout is not None
        _write_frame(self._process.stdin, pickle.dumps((target, args, kwargs)))
        ready, _, _ = select.select([self._process.stdout], [], [], self.timeout)
        if not ready:
            self.close()
            raise TimeoutError(f"the seed worker did not answer {target} in {self.timeout} s")
        status, value = pickle.loads(_read_frame(self._process.stdout))
        if status == "raised":
            raise SeedRaised(*value)
        return value

    def close(self) -> None:
        if self._process.poll() is None:
            try:
                assert self._process.stdin is not None
                self._process.stdin.close()
                self._process.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                self._process.kill()
                self._process.wait()

    def __enter__(self) -> SeedProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def call_on_ranks(workers: Sequence[SeedProcess], target: str, *args: Any) -> list[Any]:
    """``target(rank, world, rendezvous, *args)`` in each worker at once, worker r as rank r of
    one ``torch.distributed`` world meeting at a file ``rendezvous``; each rank's answer, in
    order. A rank whose call raised fails the whole, naming every failed rank."""
    world = len(workers)
    results: list[Any] = [None] * world
    with tempfile.TemporaryDirectory() as directory:
        rendezvous = os.path.join(directory, "rendezvous")

        def run(rank: int) -> None:
            try:
                results[rank] = workers[rank].call(target, rank, world, rendezvous, *args)
            except Exception as error:  # reported below, per rank
                results[rank] = error

        threads = [threading.Thread(target=run, args=(rank,)) for rank in range(world)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    failures = [f"rank {r}: {e}" for r, e in enumerate(results) if isinstance(e, Exception)]
    if failures:
        raise RuntimeError(f"{target} failed on " + "\n".join(failures))
    return results


def enter_seed_environment(
    paths: Sequence[str | os.PathLike] = (), root: Path | None = None
) -> None:
    """Make this process import the seed commit's ``megatron`` (from ``root``, default the
    extracted source) with the environment fixes of ../shared/reference/README.md; ``paths``
    follow it on ``sys.path``. For processes of their own (a worker, a spawned gloo rank) that
    have not imported megatron-core."""
    root = Path(root or source_root())
    _prepare_worker([str(root), *(str(Path(p).resolve()) for p in paths)])


def _prepare_worker(paths: list[str]) -> None:
    """The environment fixes of ../shared/reference/README.md, then the seed source first."""
    import types
    import typing

    import torch  # noqa: F401  (imported before the stub, as megatron.core does first)

    if "megatron" in sys.modules:
        raise SeedReferenceMissing("megatron is already imported here: the seed cannot be entered")
    sys.path[:0] = paths
    stub = types.ModuleType("megatron.core.transformer.moe.ops.paged_stash")

    def needs_triton(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("paged_stash needs triton (GPU only); stubbed by the test harness")

    stub.GLOBAL_BLOCK_SIZE = 0
    stub.paged_stash_copy_kernel = needs_triton
    stub.paged_stash_pop_kernel = needs_triton
    sys.modules[stub.__name__] = stub
    if not hasattr(typing, "override"):

        def override(method: Any) -> Any:
            method.__override__ = True
            return method

        typing.override = override
    import megatron.core

    if not str(Path(megatron.core.__file__).resolve()).startswith(paths[0]):
        raise SeedReferenceMissing(
            f"megatron.core resolved to {megatron.core.__file__}, not the seed source"
        )


def _serve() -> None:
    import importlib
    import traceback
    import warnings

    warnings.simplefilter("ignore")
    requests, answers = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # the seed code's prints must not corrupt the answer pipe
    _prepare_worker(os.environ["SEEDREF_PATHS"].split(os.pathsep))
    while True:
        try:
            target, args, kwargs = pickle.loads(_read_frame(requests))
        except EOFError:
            return
        module_name, _, function_name = target.partition(":")
        try:
            function = getattr(importlib.import_module(module_name), function_name)
            answer = ("ok", function(*args, **kwargs))
        except BaseException as error:  # reported to the caller, whatever it is
            classes = [cls.__name__ for cls in type(error).__mro__]
            answer = ("raised", (classes, str(error), traceback.format_exc()))
        _write_frame(answers, pickle.dumps(answer))


if __name__ == "__main__" and sys.argv[1:] == ["--worker"]:
    _serve()

"""The tokenizer backend's self-check verdicts, remembered on disk between runs.

The check (:mod:`megafmt.tokenizers.fast_backend`) encodes its stress sample with gigatoken
and with the reference library: a fixed cost per run that a large run does not notice and a
small one does. Its verdict depends only on what the key of a remembered verdict holds: the
tokenizer's digest (all that decides its ids), the stress sample itself, the versions of
gigatoken, the reference library and megafmt, the machine's architecture and Python's ABI, and
the size and modification time of gigatoken's, the library's and this backend's installed
files (a reinstall under the same version). So a verdict is remembered in one small JSON file
per key, and a later run with the same key takes it instead of checking again; any change to
the tokenizer files, the sample, a version or an installed file gives another key, and a
check. Only verdicts of the ids are remembered: a check that ended in an error (a load or an
encode that raised) runs again next time.

The folder is ``$MEGAFMT_BACKEND_CHECKS`` when set (``off`` remembers nothing and reads
nothing), else ``backend-checks`` in megafmt's cache folder (``$MEGA_CACHE_DIR``, else
``~/.cache/megafmt/idx``). A file that cannot be read as a verdict of its key (corrupt, cut
short, another key's, a symbolic link) and a folder that cannot be written never fail a run:
it checks again.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import platform
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version

from megafmt.atomic import read_unlinked, write_atomically
from megafmt.remote import default_cache_dir

#: the environment variable naming the folder, or ``off``
FOLDER_VARIABLE = "MEGAFMT_BACKEND_CHECKS"
OFF = "off"


@dataclass(frozen=True)
class Verdict:
    """What a check found: whether gigatoken passed, and the line saying why."""

    passed: bool
    reason: str


def verdict_folder() -> str | None:
    """Where verdicts are remembered, or None where the environment turns that off."""
    chosen = os.environ.get(FOLDER_VARIABLE)
    if chosen:
        return None if chosen == OFF else chosen
    return os.path.join(default_cache_dir(), "backend-checks")


def verdict_key(digest: str, texts: Sequence[str], library: str) -> str | None:
    """The key of the check of the tokenizer ``digest`` on the stress sample ``texts``
    against ``library``, with the installed versions; None where one of the packages is
    missing (nothing is remembered then)."""
    try:
        versions = {name: version(name) for name in ("gigatoken", library, "megafmt")}
    except PackageNotFoundError:
        return None
    # the same versions can run other code: another machine's build (a home shared over the
    # network), or a source tree installed again under its version
    where = [platform.machine(), sys.implementation.cache_tag, *_installed(("gigatoken", library))]
    content = json.dumps([digest, list(texts), library, versions, where], ensure_ascii=False)
    return hashlib.sha256(content.encode("utf-8", "surrogatepass")).hexdigest()


def _installed(modules: Sequence[str]) -> list[list[int | str]]:
    """The size and modification time of each of ``modules``' files (the extension module of
    a compiled package) and of this backend's own, without importing any of them."""
    files = [os.path.join(os.path.dirname(__file__), "fast_backend.py")]
    for name in modules:
        spec = importlib.util.find_spec(name)
        files.append(spec.origin if spec is not None and spec.origin else name)
    found = []
    for path in files:
        try:
            status = os.stat(path)
        except OSError:
            found.append([path])
            continue
        found.append([path, status.st_size, status.st_mtime_ns])
    return found


def remembered(key: str) -> tuple[Verdict, str] | None:
    """The verdict remembered for ``key`` and the file it came from, or None (none, the
    folder off, or a file that is no verdict of ``key``)."""
    path = _path(key)
    if path is None:
        return None
    try:
        stored = json.loads(read_unlinked(path))
    except (OSError, ValueError):
        return None
    if (
        not isinstance(stored, dict)
        or stored.get("key") != key
        or not isinstance(stored.get("passed"), bool)
        or not isinstance(stored.get("reason"), str)
    ):
        return None
    return Verdict(stored["passed"], stored["reason"]), path


def remember(key: str, verdict: Verdict) -> str | None:
    """Write ``verdict`` for ``key``; the file, or None where it could not be written (the
    folder off or unwritable: the next run checks again)."""
    path = _path(key)
    if path is None:
        return None
    record = {"key": key, "passed": verdict.passed, "reason": verdict.reason}
    with contextlib.suppress(OSError):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        write_atomically(path, json.dumps(record).encode("utf-8"))
        return path
    return None


def _path(key: str) -> str | None:
    folder = verdict_folder()
    return None if folder is None else os.path.join(folder, f"{key}.json")

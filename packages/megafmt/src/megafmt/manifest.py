"""The manifest of a corpus made by ``mega preprocess``: how it was made.

``<dir>/.mega/<name>.manifest.json`` (for the corpus ``<dir>/<name>.bin/.idx``) records the
tokenizer (plugin, fingerprint, EOD id, vocabulary size), the dtype and counts, the input files
with their sizes and the flags. ``mega info`` shows it, and the dataset builder warns when
blended corpora disagree on tokenizer or EOD. A corpus without one (made by Megatron's tool) is
as valid as ever.

It lives in a sub-folder, not beside the pair: Megatron-LM's tools/merge_datasets.py takes
every file of its input folder for half of a ``.bin``/``.idx`` pair and fails on any other
(it skips folders). megafmt 0.1.0 wrote ``<prefix>.manifest.json`` beside the pair: it
is still read, and removed with the corpus it describes.
"""

from __future__ import annotations

import json
import os
from typing import Any

from megafmt.atomic import remove_quietly, write_atomically
from megafmt.errors import FormatError, ReadError
from megafmt.folders import make_folder
from megafmt.limits import carrying_errno, limit_hint
from megafmt.redaction import redact_value

MANIFEST_FOLDER = ".mega"
MANIFEST_SUFFIX = ".manifest.json"
MANIFEST_FORMAT = "megafmt-manifest/1"


def manifest_path(path_prefix: str) -> str:
    """Where the manifest of the corpus at ``path_prefix`` lives (and is written)."""
    folder, name = os.path.split(path_prefix)
    return os.path.join(folder, MANIFEST_FOLDER, name + MANIFEST_SUFFIX)


def legacy_manifest_path(path_prefix: str) -> str:
    """Where megafmt 0.1.0 wrote it: beside the pair, where merge_datasets.py trips."""
    return path_prefix + MANIFEST_SUFFIX


def write_manifest(path_prefix: str, manifest: dict[str, Any]) -> str:
    """Write ``manifest`` (atomically) for the corpus, its folder made if need be; returns its
    path. Credentials in it (a signed input URL, a secret tokenizer option) are masked
    (:func:`~megafmt.redaction.redact_value`): the file outlives the run and travels with the
    corpus."""
    path = manifest_path(path_prefix)
    make_folder(os.path.dirname(path), "the manifest folder")
    record = redact_value({"format": MANIFEST_FORMAT, **manifest})
    write_atomically(path, json.dumps(record, indent=2).encode())
    return path


def remove_manifest(path_prefix: str) -> None:
    """Delete the manifest of ``path_prefix``, at either place: done before its corpus is
    replaced, so an old manifest never describes a new corpus."""
    remove_quietly(manifest_path(path_prefix))
    remove_quietly(legacy_manifest_path(path_prefix))


def read_manifest(path_prefix: str) -> dict[str, Any] | None:
    """The manifest of the corpus at ``path_prefix`` (or one an older version wrote beside
    it), or None when it has none."""
    for path in (manifest_path(path_prefix), legacy_manifest_path(path_prefix)):
        manifest = _read_manifest_file(path)
        if manifest is not None:
            return manifest
    return None


def _read_manifest_file(path: str) -> dict[str, Any] | None:
    """The manifest in the file ``path``, or None when there is no such file."""
    try:
        with open(path, "rb") as stream:
            manifest = json.loads(stream.read())
    except FileNotFoundError:
        return None
    except OSError as error:  # a folder in its place, no permission, no descriptor left ...
        hint = limit_hint(error, fewer=None)
        unread = ReadError(
            f"{path}: the corpus's manifest cannot be read ({error.strerror})"
            + (f": {hint}" if hint else "")
        )
        raise carrying_errno(unread, error) from error
    except (ValueError, UnicodeDecodeError) as error:
        raise FormatError(f"{path}: not valid JSON ({error})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        raise FormatError(f"{path}: expected a {MANIFEST_FORMAT} manifest")
    return manifest

"""The manifest beside a corpus made by ``mega preprocess``: how it was made.

``<prefix>.manifest.json`` records the tokenizer (plugin, fingerprint, EOD id, vocabulary
size), the dtype and counts, the input files with their sizes and the flags. ``mega info``
shows it, and the dataset builder warns when blended corpora disagree on tokenizer or EOD. A
corpus without one (made by Megatron's tool) is as valid as ever.
"""

from __future__ import annotations

import json
from typing import Any

from megafmt.atomic import atomic_write, remove_quietly
from megafmt.errors import FormatError

MANIFEST_SUFFIX = ".manifest.json"
MANIFEST_FORMAT = "megafmt-manifest/1"


def manifest_path(path_prefix: str) -> str:
    """Where the manifest of the corpus at ``path_prefix`` lives."""
    return path_prefix + MANIFEST_SUFFIX


def write_manifest(path_prefix: str, manifest: dict[str, Any]) -> str:
    """Write ``manifest`` (atomically) beside the corpus; returns its path."""
    path = manifest_path(path_prefix)
    with atomic_write(path) as stream:
        stream.write(json.dumps({"format": MANIFEST_FORMAT, **manifest}, indent=2).encode())
    return path


def remove_manifest(path_prefix: str) -> None:
    """Delete the manifest of ``path_prefix``: done before its corpus is replaced, so an old
    manifest never describes a new corpus."""
    remove_quietly(manifest_path(path_prefix))


def read_manifest(path_prefix: str) -> dict[str, Any] | None:
    """The manifest of the corpus at ``path_prefix``, or None when it has none."""
    path = manifest_path(path_prefix)
    try:
        with open(path, "rb") as stream:
            manifest = json.loads(stream.read())
    except FileNotFoundError:
        return None
    except (ValueError, UnicodeDecodeError) as error:
        raise FormatError(f"{path}: not valid JSON ({error})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        raise FormatError(f"{path}: expected a {MANIFEST_FORMAT} manifest")
    return manifest

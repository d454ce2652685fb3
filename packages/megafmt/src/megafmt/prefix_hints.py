"""What a corpus prefix one step off most likely meant, for the "not found" errors.

A corpus is named by its prefix, without ``.bin``/``.idx``; ``mega preprocess`` names its
outputs ``<output-prefix>_<key>_document``. Two slips are common: passing the prefix with a
suffix (``corpus.bin``, so ``corpus.bin.idx`` is looked for), and passing the preprocess output
prefix without the ``_<key>_document`` part. :func:`missing_file_hint` names the corpus that is
there in either case, so the error says what to pass instead of naming a file that was never
meant.
"""

from __future__ import annotations

import glob
import os

from megafmt.format import BIN_SUFFIX, IDX_SUFFIX

#: how many candidates a hint lists at most
SHOWN_CANDIDATES = 3


def missing_file_hint(path: str) -> str:
    """A hint for the missing ``.bin`` or ``.idx`` file ``path`` of a local corpus: ``""``,
    or ``"; did you mean ...?"`` naming the corpus prefix that exists."""
    prefix, suffix = os.path.splitext(path)
    if suffix not in (BIN_SUFFIX, IDX_SUFFIX) or "://" in path:
        return ""
    stem, inner = os.path.splitext(prefix)
    if inner in (BIN_SUFFIX, IDX_SUFFIX) and os.path.isfile(prefix):
        return f"; a corpus is named by its prefix without {inner}: did you mean {stem!r}?"
    pattern = glob.escape(prefix) + "_*" + IDX_SUFFIX
    candidates = sorted(
        candidate[: -len(IDX_SUFFIX)]
        for candidate in glob.glob(pattern)
        if candidate.endswith(("_document" + IDX_SUFFIX, "_sentence" + IDX_SUFFIX))
    )
    if not candidates:
        return ""
    shown = " or ".join(repr(c) for c in candidates[:SHOWN_CANDIDATES])
    return (
        f"; mega preprocess names its outputs <output-prefix>_<key>_document: did you mean {shown}?"
    )


def missing_file_message(path: str, what: str) -> str:
    """Why the ``.bin`` or ``.idx`` file ``path`` (``what``: "token file", "index file") of a
    corpus cannot be opened, without the path: a directory in its place, or no file (with
    :func:`missing_file_hint`'s hint)."""
    if "://" not in path and os.path.isdir(path):
        return f"found a directory where the {what} belongs"
    return f"{what} not found{missing_file_hint(path)}"

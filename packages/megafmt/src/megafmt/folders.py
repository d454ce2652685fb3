"""Folders the project writes into (cache folders, output folders), made with errors that say
what stands in their way.

``os.makedirs(path, exist_ok=True)`` answers "File exists" both for a file at ``path`` and for
a symbolic link whose target does not exist, without saying which, or which component of the
path it is. :func:`make_folder` names the component and what it is (a file, or a link and the
missing target it points to), so the user knows what to remove or create.
"""

from __future__ import annotations

import os

from megafmt.errors import NotAFolderError


def _blocking_component(path: str) -> str | None:
    """The first component of ``path`` (from the root down) that exists but is not a folder,
    or None."""
    absolute = os.path.abspath(path)
    parts = absolute.split(os.sep)
    for end in range(2, len(parts) + 1):
        component = os.sep.join(parts[:end]) or os.sep
        if os.path.lexists(component) and not os.path.isdir(component):
            return component
    return None


def make_folder(path: str, what: str) -> None:
    """Create the folder ``path`` (``what`` names it in errors: "the cache folder") with its
    parents, or find it there; raises :class:`~megafmt.errors.NotAFolderError` naming the
    component in the way when one is a file or a symbolic link to nothing."""
    if os.path.isdir(path):  # one stat: a cache saving thousands of entries asks each time
        return
    try:
        os.makedirs(path, exist_ok=True)
    except (FileExistsError, FileNotFoundError, NotADirectoryError) as error:
        component = _blocking_component(path)
        if component is None:
            raise
        if os.path.islink(component):
            found = (
                f"a symbolic link to {os.readlink(component)!r}, which does not exist"
                if not os.path.exists(component)
                else "a symbolic link to something that is not a folder"
            )
        else:
            found = "a file"
        where = path if component == os.path.abspath(path) else f"{path} (at {component})"
        raise NotAFolderError(
            f"{where}: {what} must be a folder, found {found}; create the folder, or remove "
            "what is at that name"
        ) from error

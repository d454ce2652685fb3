"""Local paths made from remote keys or names, kept inside their folder.

The local copies of a remote corpus (its ``.idx``, its index tables) are stored under a cache
folder at a path made from the corpus URL. An object key may hold ``..`` or start with ``/``
(S3 accepts both): joined naively, such a key would write outside the cache folder, over any
file the process may write. Here every component is checked: ``..``, ``.`` and absolute
components are refused with :class:`~megafmt.errors.UnsafePathError`, and the joined path is
checked to lie under its root. The user info and query of a URL (credentials) never become part
of a local path.
"""

from __future__ import annotations

import os
from urllib.parse import urlsplit

from megafmt.errors import UnsafePathError
from megafmt.redaction import redact, split_user_info

#: components that would not name a file inside the folder
_UNSAFE = (".", "..")


def url_components(url: str) -> list[str]:
    """The scheme, host (without user info) and key components of ``url``, for a local path;
    raises :class:`~megafmt.errors.UnsafePathError` if a component is ``..`` or ``.``."""
    scheme, _, rest = split_user_info(url)
    parts = urlsplit(scheme + rest)
    host = parts.netloc
    components = [part for part in (parts.scheme, host, *parts.path.split("/")) if part]
    for component in components:
        if component in _UNSAFE or "\\" in component or "\0" in component:
            raise UnsafePathError(
                f"{redact(url)}: the component {component!r} would make a local copy leave its "
                "cache folder; expected a URL whose key has no '.' or '..' parts"
            )
    return components


def confined_path(root: str, *components: str) -> str:
    """``root`` joined with ``components``, each a relative path; raises
    :class:`~megafmt.errors.UnsafePathError` naming the component when one is absolute or
    holds ``..``, so that the result always lies inside ``root``."""
    for component in components:
        if os.path.isabs(component) or ".." in component.replace("\\", "/").split("/"):
            raise UnsafePathError(
                f"{root}: the path component {redact(component)!r} is absolute or holds '..'; "
                "expected a path relative to this folder"
            )
    path = os.path.normpath(os.path.join(root, *components))
    base = os.path.normpath(os.path.abspath(root))
    if os.path.commonpath([base, os.path.abspath(path)]) != base:
        raise UnsafePathError(f"{path}: lies outside {root}, expected a path inside it")
    return path

"""A registry of named plugins, filled from an entry-point group and loaded on first use.

Every package of the project keeps its choices by name (storage readers, tokenizers, dataset
classes, samplers, CLI commands) in one of these. Built-in plugins are declared as entry points
like any third party's, so installing a package is all it takes to add one. Entry points are
listed when the registry is first consulted but imported only when their name is asked for.
"""

from __future__ import annotations

import difflib
import threading
from collections.abc import Iterator, Mapping
from importlib.metadata import EntryPoint, PackageNotFoundError, distribution, entry_points
from typing import Generic, TypeVar

from megafmt.errors import PluginError
from megafmt.protocols import protocol_members

T = TypeVar("T")


class Registry(Generic[T]):
    """Named plugins of one kind.

    ``group`` is the entry-point group, ``kind`` how messages name a plugin ("megafmt
    reader"). ``required`` lists attributes a loaded plugin must have. ``claimable`` lists
    Protocols a plugin may implement: one that has some of a Protocol's members claims it, and
    must have them all (else a caller's ``isinstance`` would quietly pass it by, or take it for
    what it is not). ``providers`` maps names that other distributions provide to the hint shown
    when such a name is asked for but not installed (``{"index": "pip install megaindex"}``).
    """

    def __init__(
        self,
        group: str,
        kind: str,
        *,
        required: tuple[str, ...] = (),
        claimable: tuple[type, ...] = (),
        providers: Mapping[str, str] | None = None,
        home: str | None = None,
    ) -> None:
        self.group = group
        self.home = home
        self.kind = kind
        self._required = required
        self._claimable = claimable
        self._providers = dict(providers or {})
        self._entry_points: dict[str, EntryPoint] | None = None
        self._home_points: dict[str, EntryPoint] | None = None
        self._loaded: dict[str, T] = {}  # entry points imported so far
        self._registered: dict[str, T] = {}  # objects added with register()
        self._lock = threading.Lock()

    def _home(self) -> dict[str, EntryPoint]:
        """The group's entry points of the ``home`` distribution: reading one distribution's
        metadata is much cheaper than scanning every installed one, and its own names win."""
        if self._home_points is None:
            try:
                points = distribution(self.home).entry_points if self.home else ()
            except PackageNotFoundError:
                points = ()
            self._home_points = {p.name: p for p in points if p.group == self.group}
        return self._home_points

    def _discovered(self) -> dict[str, EntryPoint]:
        if self._entry_points is None:
            found: dict[str, EntryPoint] = {}
            for point in entry_points(group=self.group):
                found.setdefault(point.name, point)
            found.update(self._home())
            self._entry_points = found
        return self._entry_points

    def available(self) -> list[str]:
        """The names that can be asked for, sorted."""
        return sorted(set(self._discovered()) | set(self._registered))

    def __contains__(self, name: object) -> bool:
        return name in self._registered or name in self._discovered()

    def __iter__(self) -> Iterator[str]:
        return iter(self.available())

    def __len__(self) -> int:
        return len(self.available())

    def view(self) -> Mapping[str, str]:
        """A read-only description of each name: ``module:attr`` or the object's repr."""
        described = {name: point.value for name, point in self._discovered().items()}
        described.update({name: repr(obj) for name, obj in self._registered.items()})
        return dict(sorted(described.items()))

    def get(self, name: str) -> T:
        """The plugin called ``name``, imported on first use."""
        with self._lock:
            if name in self._registered:
                return self._registered[name]
            if name in self._loaded:
                return self._loaded[name]
            point = self._home().get(name) or self._discovered().get(name)
            if point is None:
                raise PluginError(self.unknown_message(name))
            obj = self._load(point)
            self._loaded[name] = obj
            return obj

    def register(self, name: str, obj: T, replace: bool = False) -> None:
        """Add ``obj`` under ``name``; an existing name is refused unless ``replace``."""
        with self._lock:
            if not replace and name in self:
                raise PluginError(
                    f"{self.kind} {name!r} is already registered "
                    f"({self.view()[name]}); pass replace=True to override it"
                )
            self._check(name, obj, origin=repr(obj))
            self._registered[name] = obj

    def unregister(self, name: str) -> None:
        """Remove what ``register(name, ...)`` added (a plugin for one test or one session);
        entry points are not removed: they come with an installed distribution."""
        with self._lock:
            if name not in self._registered:
                raise PluginError(
                    f"{self.kind} {name!r} was not added with register(), so it cannot be "
                    f"unregistered; registered: {sorted(self._registered) or 'none'}"
                )
            del self._registered[name]

    def _load(self, point: EntryPoint) -> T:
        distribution = point.dist.name if point.dist is not None else "an unknown distribution"
        origin = f"entry point {point.name} = {point.value} in {distribution}"
        try:
            obj = point.load()
        except ImportError as error:
            hint = self._providers.get(point.name)
            extra = f"; {hint}" if hint else ""
            raise PluginError(
                f"{self.kind} {point.name!r} is installed but cannot be imported "
                f"({origin}): {error}{extra}"
            ) from error
        except AttributeError as error:
            raise PluginError(f"broken {origin}: {error}") from error
        self._check(point.name, obj, origin)
        return obj

    def _check(self, name: str, obj: object, origin: str) -> None:
        missing = [attr for attr in self._required if not hasattr(obj, attr)]
        if missing:
            raise PluginError(
                f"{self.kind} {name!r} ({origin}) lacks required attribute(s) {', '.join(missing)}"
            )
        for protocol in self._claimable:
            members = protocol_members(protocol)
            has = [member for member in members if hasattr(obj, member)]
            if has and len(has) < len(members):
                lacks = [member for member in members if member not in has]
                raise PluginError(
                    f"{self.kind} {name!r} ({origin}) has {', '.join(has)} of "
                    f"{protocol.__module__}.{protocol.__qualname__} but lacks "
                    f"{', '.join(lacks)}: implement all of {', '.join(members)}, or none"
                )

    def unknown_message(self, name: str) -> str:
        """Why ``name`` cannot be found: what is available, the closest match, a provider hint."""
        names = self.available()
        message = f"unknown {self.kind} {name!r}; available: {', '.join(names) or '(none)'}"
        close = difflib.get_close_matches(name, names, n=1)
        if close:
            message += f" (did you mean {close[0]!r}?)"
        if name in self._providers:
            message += f"; {self._providers[name]}"
        return message

"""conforms(obj, protocol) answers as isinstance does, for every Protocol of the data path and
the .bin readers, on megafmt's own objects and on hand-made ones that miss a member, opt out
of one with None, hold a data member on the instance only, set their methods on the instance
or serve them from ``__getattr__``."""

import inspect
from typing import Protocol, runtime_checkable

import pytest

from megafmt import IndexedDataset, protocols
from megafmt.protocols import conforms
from megafmt.readers import base
from megafmt.testing import write_corpus


def _runtime_protocols(module) -> list[type]:
    return [
        value
        for _, value in inspect.getmembers(module, inspect.isclass)
        if issubclass(value, Protocol)
        and value is not Protocol
        and getattr(value, "_is_runtime_protocol", False)
    ]


PROTOCOLS = _runtime_protocols(protocols) + _runtime_protocols(base)


class Stored:
    """A token source whose path_prefix is an instance attribute, set or not."""

    sequence_lengths = property(lambda self: [])

    def __init__(self, prefix: str | None) -> None:
        if prefix is not None:
            self.path_prefix = prefix

    def get(self, idx, offset=0, length=None):
        return []


class OptedOut(Stored):
    """Declines ``get`` with None, as a class opts out of a method."""

    get = None


class NoMethods:
    pass


class SetOnInstance:
    """A token source whose methods are set on each instance, not defined by its class."""

    def __init__(self) -> None:
        self.sequence_lengths = []
        self.path_prefix = "corpus"
        self.get = lambda idx, offset=0, length=None: []


class Delegating:
    """A token source that serves every member from the object it wraps (``__getattr__``)."""

    def __init__(self, inner: object) -> None:
        self._inner = inner

    def __getattr__(self, name: str):
        return getattr(self._inner, name)


def _objects(tmp_path) -> list[object]:
    prefix = write_corpus(str(tmp_path / "corpus"), 20, seed=0)
    dataset = IndexedDataset(prefix)
    return [
        dataset,
        dataset.bin_reader,
        IndexedDataset(prefix, mmap=False).bin_reader,
        Stored("corpus"),
        Stored(None),
        OptedOut("corpus"),
        NoMethods(),
        SetOnInstance(),
        Delegating(dataset),
        Delegating(object()),
        object(),
        "text",
    ]


@pytest.mark.parametrize("protocol", PROTOCOLS, ids=lambda p: p.__name__)
def test_conforms_answers_as_isinstance(protocol, tmp_path):
    for obj in _objects(tmp_path):
        first, again = conforms(obj, protocol), conforms(obj, protocol)  # again: remembered
        assert first == again == isinstance(obj, protocol), (type(obj).__name__, protocol)


def test_a_data_member_is_looked_up_on_each_instance():
    assert conforms(Stored("corpus"), protocols.StoredTokenSource)
    assert not conforms(Stored(None), protocols.StoredTokenSource)  # same class, no attribute
    assert conforms(Stored("again"), protocols.StoredTokenSource)
    assert not conforms(OptedOut("corpus"), protocols.TokenSource)  # get = None: opted out


class LacksGet:
    """A token source whose class lacks ``get``: objects of it conform only by setting one."""

    sequence_lengths = property(lambda self: [])
    path_prefix = "corpus"


def test_a_class_that_lacks_a_method_is_asked_again_for_each_object_that_sets_it():
    plain, supplied, again = LacksGet(), LacksGet(), LacksGet()
    supplied.get = lambda idx, offset=0, length=None: []
    assert not conforms(plain, protocols.TokenSource)
    assert conforms(supplied, protocols.TokenSource)  # not the class's remembered answer
    assert not conforms(again, protocols.TokenSource)


def test_a_class_registered_with_a_protocol_conforms_without_its_methods():
    @runtime_checkable
    class Readable(Protocol):
        def read(self) -> bytes: ...

    class Registered:
        pass

    Readable.register(Registered)
    for obj in (Registered(), Registered()):  # the second: the remembered answer
        assert conforms(obj, Readable) == isinstance(obj, Readable) is True
    assert not conforms(NoMethods(), Readable)


def test_a_class_asked_about_is_not_kept_alive_by_the_answer():
    """Classes made at run time (a factory's, a test's) are freed when nothing else holds them:
    what conforms remembers of a class goes with it."""
    import gc
    import weakref

    def made() -> tuple[weakref.ref, weakref.ref]:
        class Made:
            def __init__(self) -> None:
                self.sequence_lengths = []

        class Lacking:
            pass

        assert not conforms(Made(), protocols.TokenSource)
        assert not conforms(Lacking(), protocols.TokenSource)
        assert conforms(Made(), protocols.TokenSource) == isinstance(Made(), protocols.TokenSource)
        return weakref.ref(Made), weakref.ref(Lacking)

    classes = made()
    gc.collect()
    assert [cls() for cls in classes] == [None, None]

from importlib.metadata import EntryPoint

import pytest

from megafmt import PluginError
from megafmt import registry as registry_module
from megafmt.registry import Registry


@pytest.fixture
def registry(monkeypatch):
    points = [
        EntryPoint("good", "megafmt.readers.mmap_reader:MMapBinReader", "test.group"),
        EntryPoint("missing_module", "megafmt.no_such_module:Thing", "test.group"),
        EntryPoint("missing_attr", "megafmt.readers.mmap_reader:NoSuchThing", "test.group"),
        EntryPoint("lacking", "megafmt.errors:MegafmtError", "test.group"),
    ]
    monkeypatch.setattr(registry_module, "entry_points", lambda group: points)
    return Registry(
        "test.group", "test plugin", required=("read",), providers={"s3": "pip install 'x[s3]'"}
    )


@pytest.fixture
def loads(monkeypatch):
    """The names of the entry points loaded (imported), in order."""
    loaded = []
    real = EntryPoint.load
    monkeypatch.setattr(EntryPoint, "load", lambda point: loaded.append(point.name) or real(point))
    return loaded


def test_names_are_listed_sorted_without_importing(registry, loads):
    assert registry.available() == ["good", "lacking", "missing_attr", "missing_module"]
    assert "good" in registry and "nope" not in registry
    assert registry.view()["good"] == "megafmt.readers.mmap_reader:MMapBinReader"
    assert loads == []


def test_get_loads_and_caches(registry, loads):
    from megafmt.readers.mmap_reader import MMapBinReader

    assert registry.get("good") is MMapBinReader
    assert registry.get("good") is MMapBinReader
    assert loads == ["good"]  # imported on first use only


def test_unknown_name_lists_what_exists_and_suggests(registry):
    with pytest.raises(
        PluginError,
        match=r"unknown test plugin 'god'; available: good, lacking, "
        r"missing_attr, missing_module \(did you mean 'good'\?\)",
    ):
        registry.get("god")
    with pytest.raises(PluginError, match=r"unknown test plugin 's3'.*; pip install 'x\[s3\]'"):
        registry.get("s3")


def test_broken_entry_points_are_named(registry):
    with pytest.raises(
        PluginError,
        match=r"'missing_module' is installed but cannot be imported "
        r"\(entry point missing_module = megafmt.no_such_module:Thing",
    ):
        registry.get("missing_module")
    with pytest.raises(
        PluginError,
        match=r"broken entry point missing_attr = "
        r"megafmt.readers.mmap_reader:NoSuchThing",
    ):
        registry.get("missing_attr")
    with pytest.raises(PluginError, match=r"'lacking' .* lacks required attribute\(s\) read"):
        registry.get("lacking")


def test_register_refuses_silent_replacement(registry):
    class Reader:
        def read(self):
            return 1

    registry.register("mine", Reader)
    assert registry.get("mine") is Reader
    with pytest.raises(PluginError, match="'good' is already registered .* replace=True"):
        registry.register("good", Reader)
    registry.register("good", Reader, replace=True)
    assert registry.get("good") is Reader
    with pytest.raises(PluginError, match="lacks required attribute"):
        registry.register("bad", object())


def test_unregister_removes_only_what_register_added(registry):
    class Reader:
        def read(self):
            return 1

    registry.register("mine", Reader)
    registry.register("good", Reader, replace=True)
    registry.unregister("mine")
    assert "mine" not in registry and "mine" not in registry.available()
    registry.unregister("good")  # the entry point it replaced is what "good" names again
    assert registry.get("good").__name__ == "MMapBinReader"
    with pytest.raises(PluginError, match="'good' was not added with register.*registered: none"):
        registry.unregister("good")


def test_the_home_distribution_wins_its_own_names(monkeypatch):
    from megafmt.readers.mmap_reader import MMapBinReader

    impostor = EntryPoint("mmap", "megafmt.errors:MegafmtError", "megafmt.readers")
    monkeypatch.setattr(registry_module, "entry_points", lambda group: [impostor])
    readers = Registry("megafmt.readers", "megafmt reader", home="megafmt")
    assert readers.get("mmap") is MMapBinReader
    assert readers.view()["mmap"] == "megafmt.readers.mmap_reader:MMapBinReader"
    assert "file" in readers.available()

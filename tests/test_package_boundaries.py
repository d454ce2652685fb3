"""What each package may import of another: megafmt's API, its declared Protocols and what it
lends its siblings; megaload and megadist never import megaindex or each other."""

import ast
from pathlib import Path

import pytest

PACKAGES = Path(__file__).resolve().parents[1] / "packages"
#: megafmt.sft: the SDK's supervised fine-tuning data (jsonl index, SFT tokenizer), public;
#: megafmt.demo: what the stages of `mega demo` share, public for every package's stages;
#: megafmt.cli.command: what a `mega.commands` plugin is (DeferredCommand among it);
#: megafmt.lazy_exports: a package's exports imported when first used
MEGAFMT_MODULES_FOR_SIBLINGS = {
    "megafmt",
    "megafmt.protocols",
    "megafmt.shared",
    "megafmt.sft",
    "megafmt.demo",
    "megafmt.cli.command",
    "megafmt.lazy_exports",
}
FORBIDDEN = {"megaload": {"megaindex", "megadist"}, "megadist": {"megaindex", "megaload"}}


def imported_modules(package):
    for path in sorted((PACKAGES / package / "src" / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                yield path, node.module
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    yield path, alias.name


@pytest.mark.parametrize("package", ["megaindex", "megaload", "megadist"])
def test_siblings_use_only_what_megafmt_offers_them(package):
    strays = [
        f"{path.name}: {module}"
        for path, module in imported_modules(package)
        if module.split(".")[0] == "megafmt" and module not in MEGAFMT_MODULES_FOR_SIBLINGS
    ]
    strays += [
        f"{path.name}: {module}"
        for path, module in imported_modules(package)
        if module.split(".")[0] in FORBIDDEN.get(package, ())
    ]
    assert strays == []


def test_the_sdk_api_holds_none_of_what_megafmt_lends_its_siblings():
    import megafmt.shared

    assert set(megafmt.__all__).isdisjoint(megafmt.shared.__all__)

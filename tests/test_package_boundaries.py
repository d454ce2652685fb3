"""What each package may import of another: megafmt's API, its declared Protocols and the small
public modules it lends its siblings (each documented on the megafmt API page); megaload and
megadist never import megaindex or each other."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ROOT / "packages"
#: megafmt.sft: the SDK's supervised fine-tuning data (jsonl index, SFT tokenizer), public;
#: megafmt.demo: what the stages of `mega demo` share, public for every package's stages;
#: megafmt.cli.command: what a `mega.commands` plugin is (DeferredCommand among it) and the
#: argparse count types; megafmt.lazy_exports: a package's exports imported when first used
MEGAFMT_MODULES_FOR_SIBLINGS = {
    "megafmt",
    "megafmt.protocols",
    "megafmt.sft",
    "megafmt.demo",
    "megafmt.cli.command",
    "megafmt.lazy_exports",
}
#: the small public modules megafmt lends its siblings, one concept each (they replace the
#: former ``megafmt.shared`` facade); each is documented on docs/api/megafmt.md
LENT_MODULES = {
    "megafmt.atomic",
    "megafmt.blend_list",
    "megafmt.checked",
    "megafmt.cli.tokenizer_flags",
    "megafmt.confinement",
    "megafmt.fingerprint",
    "megafmt.folders",
    "megafmt.limits",
    "megafmt.mapping",
    "megafmt.prefix_hints",
    "megafmt.progress",
    "megafmt.readers",
    "megafmt.redaction",
    "megafmt.registry",
    "megafmt.remote",
    "megafmt.tokenizers",
    "megafmt.tokenizers.identity",
}
MEGAFMT_MODULES_FOR_SIBLINGS |= LENT_MODULES
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


@pytest.mark.parametrize("module", sorted(LENT_MODULES))
def test_what_megafmt_lends_its_siblings_is_public_and_documented(module):
    assert not any(part.startswith("_") for part in module.split("."))
    api_page = (ROOT / "docs" / "api" / "megafmt.md").read_text()
    assert f"::: {module}\n" in api_page, f"docs/api/megafmt.md documents no {module}"

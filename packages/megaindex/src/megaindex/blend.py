"""Reading blends the way Megatron-LM's command line states them.

``--data-path`` (or ``--data-args-path``, a file holding the same words) is a single prefix, a
list of ``weight prefix`` pairs, or a list of prefixes whose weights come from their sizes.
``--train-data-path``/``--valid-data-path``/``--test-data-path`` (or ``--per-split-data-args-path``,
a JSON file ``{"train": ..., "valid": ..., "test": ...}``) give each split its own blend.

The results equal megatron-core's ``get_blend_from_list`` for every list it accepts. Where it
would guess (a list mixing numbers and prefixes, a negative or zero weight) or fail later with a
bare error (a prefix that does not exist), this module says which item is wrong.
"""

from __future__ import annotations

import json
import logging
import os
import warnings
from collections.abc import Sequence
from typing import Any

from megafmt import IndexedDataset, read_manifest
from megafmt.blend_list import Blend, BlendListError, parse_blend_list
from megafmt.mapping import mapping_limit, mappings_in_use
from megafmt.prefix_hints import missing_file_hint, missing_file_message
from megafmt.readers import is_url
from megaindex.errors import ConfigError

logger = logging.getLogger(__name__)

#: the splits a per-split blend names, in order
SPLITS = ("train", "valid", "test")
#: the split Megatron-LM falls back to when only a data path is given
LEGACY_DEFAULT_SPLIT = "969, 30, 1"


def get_blend_from_list(
    blend: Sequence[str] | None, *, argument: str = "--data-path"
) -> Blend | None:
    """``["30", "a", "70", "b"]`` -> ``(["a", "b"], [30.0, 70.0])``; ``["a", "b"]`` ->
    ``(["a", "b"], None)`` (weights from sizes); a single prefix -> ``(["a"], None)``; None ->
    None. ``argument`` names the flag the list comes from in the errors."""
    if blend is None:
        return None
    try:
        return parse_blend_list(blend, argument)
    except BlendListError as error:
        raise ConfigError(str(error)) from None


def _words(path: str) -> list[str]:
    try:
        with open(path, encoding="utf-8") as stream:
            return stream.read().split()
    except OSError as error:
        raise ConfigError(f"cannot read the data arguments file {path}: {error}") from error


def get_blend_and_blend_per_split(
    data_path: Sequence[str] | None = None,
    data_args_path: str | None = None,
    train_data_path: Sequence[str] | None = None,
    valid_data_path: Sequence[str] | None = None,
    test_data_path: Sequence[str] | None = None,
    per_split_data_args_path: str | None = None,
) -> tuple[Blend | None, list[Blend | None] | None]:
    """``(blend, blend_per_split)`` from Megatron-LM's data arguments (at most one form)."""
    per_split = [train_data_path, valid_data_path, test_data_path]
    uses_blend = data_path is not None or data_args_path is not None
    uses_per_split = any(p is not None for p in per_split) or per_split_data_args_path is not None
    if uses_blend and uses_per_split:
        raise ConfigError(
            "give either --data-path/--data-args-path or the per-split data paths, not both"
        )
    if uses_blend:
        if data_path is not None and data_args_path is not None:
            raise ConfigError("give --data-path or --data-args-path, not both")
        if data_args_path is not None:
            return get_blend_from_list(
                _words(data_args_path), argument=f"--data-args-path {data_args_path}"
            ), None
        return get_blend_from_list(data_path), None
    if not uses_per_split:
        return None, None
    if per_split_data_args_path is not None:
        try:
            with open(per_split_data_args_path, encoding="utf-8") as stream:
                by_split = json.load(stream)
        except (OSError, ValueError) as error:
            raise ConfigError(f"cannot read {per_split_data_args_path}: {error}") from error
        if not isinstance(by_split, dict):
            raise ConfigError(
                f"{per_split_data_args_path}: expected a JSON object with the keys train, valid "
                f"and test, found {type(by_split).__name__}"
            )
        missing = [name for name in SPLITS if name not in by_split]
        if missing:
            raise ConfigError(
                f"{per_split_data_args_path} has no {', '.join(missing)} entry; "
                "expected keys train, valid and test"
            )
        for name in SPLITS:
            _check_split_entry(per_split_data_args_path, name, by_split[name])
        per_split = [_split_words(by_split[name]) for name in SPLITS]
    sources = (
        [f"--per-split-data-args-path {per_split_data_args_path} [{name!r}]" for name in SPLITS]
        if per_split_data_args_path is not None
        else [f"--{name}-data-path" for name in SPLITS]
    )
    return None, [
        get_blend_from_list(blend, argument=source)
        for blend, source in zip(per_split, sources, strict=True)
    ]


def _check_split_entry(path: str, name: str, value: Any) -> None:
    """Refuse a split's entry of a per-split data args file unless it is what Megatron-LM
    reads there: a string of prefixes (and weights), a list of them, or null (no data)."""
    if value is None or isinstance(value, str):
        return
    if isinstance(value, list):
        for position, item in enumerate(value):
            if not isinstance(item, str | int | float) or isinstance(item, bool):
                raise ConfigError(
                    f"{path}: {name}[{position}] is {type(item).__name__} {item!r}; expected a "
                    "dataset prefix or a weight"
                )
        return
    raise ConfigError(
        f"{path}: the {name} entry is {type(value).__name__} {value!r}; expected a string of "
        "prefixes (and weights), a list of them, or null"
    )


def _split_words(value: str | list | None) -> list[str] | None:
    """A checked entry as the words of a blend list: a JSON number is a weight written as a
    number (in a prefix's place, the prefix check names it)."""
    if value is None:
        return None
    if isinstance(value, str):
        return value.split()
    return [item if isinstance(item, str) else repr(item) for item in value]


def default_split(split: str | None, blend: Blend | None) -> str | None:
    """Megatron-LM's split when none is given with a data path: the legacy 969,30,1 (with a
    warning: 3% validation, not the 99,1,0 most people expect)."""
    if split is None and blend is not None:
        warnings.warn(
            f"no split given with the data path: using Megatron's legacy default "
            f"{LEGACY_DEFAULT_SPLIT!r} (96.9% train, 3% validation, 0.1% test); pass a split "
            "such as '99,1,0' to choose",
            stacklevel=2,
        )
        return LEGACY_DEFAULT_SPLIT
    return split


#: how many missing corpora the error of :func:`check_prefixes_exist` names, each with what it
#: lacks (a mistyped root of thousands named them all: 165 KB)
SHOWN_MISSING = 5


def check_prefixes_exist(blends: Sequence[Blend | None]) -> None:
    """Raise naming the prefixes whose ``.bin``/``.idx`` pair is missing (the first
    :data:`SHOWN_MISSING`, each with the file it lacks and the corpus it most likely meant,
    then how many more and the folders that do not exist)."""
    prefixes = {prefix for blend in blends if blend is not None for prefix in blend[0]}
    missing = [prefix for prefix in prefixes if not IndexedDataset.exists(prefix)]
    if not missing:
        return
    gone = {p: not is_url(p) and not os.path.isdir(os.path.dirname(p) or ".") for p in missing}
    missing.sort(key=lambda prefix: (gone[prefix], prefix))  # a slip beside its corpus first
    named = ", ".join(f"{prefix} ({_lacks(prefix)})" for prefix in missing[:SHOWN_MISSING])
    more = len(missing) - SHOWN_MISSING
    if more > 0:
        named += f", and {more:,} more ({len(missing):,} of the blend's {len(prefixes):,})"
    folders = sorted({os.path.dirname(prefix) for prefix in missing if gone[prefix]})
    if folders:
        named += "; no such folder: " + ", ".join(folders[:SHOWN_MISSING])
        if len(folders) > SHOWN_MISSING:
            named += f", and {len(folders) - SHOWN_MISSING:,} more"
    raise ConfigError(f"no .bin/.idx corpus at: {named} (working directory {os.getcwd()})")


def _lacks(prefix: str) -> str:
    """What the corpus at ``prefix`` lacks: each missing file (or a folder in its place), with
    the likely slip."""
    if is_url(prefix):  # which of the two objects is missing is the store's to say
        return "not found in object storage"
    lacking = [
        (prefix + suffix, what)
        for suffix, what in ((".idx", "index file"), (".bin", "token file"))
        if not os.path.isfile(prefix + suffix)
    ]
    if len(lacking) == 2 and not any(os.path.isdir(path) for path, _ in lacking):
        return "neither .idx nor .bin found" + missing_file_hint(prefix + ".idx")
    return "; ".join(missing_file_message(path, what) for path, what in lacking)


#: memory mappings of each corpus opened (its ``.idx`` and ``.bin``), of each dataset over one
#: (its three index tables) and of each blend (its two), once read
MAPPINGS_PER_CORPUS = 2
MAPPINGS_PER_DATASET = 3
MAPPINGS_PER_BLEND = 2


def check_mappings_fit(corpora: int, datasets: int, blends: int) -> str | None:
    """Warn when a build's ``corpora`` (each time one is opened), the ``datasets`` over them
    and its ``blends``, once every part has been read, would hold more memory mappings than the
    system allows a process (Linux's ``vm.max_map_count``, 65,530 by default: about 13,000
    corpora of one split, 5,900 of three): the mapping past the limit fails in the middle of
    training. Returns the warning given, if any."""
    limit, held = mapping_limit(), mappings_in_use()
    if limit is None or held is None:
        return None
    needed = (
        held
        + MAPPINGS_PER_CORPUS * corpora
        + MAPPINGS_PER_DATASET * datasets
        + MAPPINGS_PER_BLEND * blends
    )
    if needed <= limit:
        return None
    message = (
        f"the datasets of {corpora:,} corpora may need {needed:,} memory mappings once every "
        f"part has been read ({MAPPINGS_PER_CORPUS} for each corpus opened, its .idx and .bin; "
        f"{MAPPINGS_PER_DATASET} for each of the {datasets:,} datasets over them, their index "
        f"tables; {MAPPINGS_PER_BLEND} for each of the {blends} blends; {held:,} held already), "
        f"more than the {limit:,} the system allows a process (vm.max_map_count): the first "
        "mapping past it fails with 'Cannot allocate memory'. Raise the limit, e.g. "
        f"sysctl -w vm.max_map_count={1 << (2 * needed - 1).bit_length()}"
    )
    logger.warning(message)
    warnings.warn(message, stacklevel=2)
    return message


def check_tokenizers_agree(blends: Sequence[Blend | None]) -> list[str]:
    """Warn when the corpora of the blends were tokenized differently.

    Corpora made by ``mega preprocess`` carry a manifest naming their tokenizer (a fingerprint
    of its files and settings) and EOD id; mixing corpora whose ids mean different things
    trains silently on garbage. Corpora without a manifest are not judged. Returns the
    warnings given.
    """
    prefixes = sorted({p for blend in blends if blend is not None for p in blend[0]})
    groups: dict[tuple[object, object], list[str]] = {}
    for prefix in prefixes:
        manifest = read_manifest(prefix)
        if manifest is None:
            continue
        tokenizer = manifest.get("tokenizer", {})
        key = (tokenizer.get("fingerprint"), tokenizer.get("eod"))
        groups.setdefault(key, []).append(prefix)
    if len(groups) < 2:
        return []
    described = "; ".join(
        f"fingerprint {str(fingerprint)[:19]} eod {eod}: {', '.join(members)}"
        for (fingerprint, eod), members in groups.items()
    )
    message = f"the blended corpora were tokenized differently ({described})"
    logger.warning(message)
    warnings.warn(message, stacklevel=2)
    return [message]

"""``IndexedDatasetBuilder.add_document`` against the seed commit's builder: every id (and
sequence length) numpy converts exactly is taken, in each form callers pass, and the files are
the seed's bytes; a value the conversion would change is refused here, where the seed raises or
writes another value."""

from __future__ import annotations

from pathlib import Path

import numpy
import pytest
import torch
from seedref import SeedRaised

import megafmt

pytestmark = pytest.mark.compat


@pytest.fixture(scope="module")
def seed(shared_seed):
    return shared_seed


def mixed_objects(ids: list[int]) -> numpy.ndarray:
    """An object array of ints and digit strings, alternating."""
    return numpy.array([str(i) if n % 2 else int(i) for n, i in enumerate(ids)], dtype=object)


TOKEN_FORMS = {
    "ints": lambda ids: [int(i) for i in ids],
    "digit strings": lambda ids: [str(i) for i in ids],
    "numpy scalars": lambda ids: [numpy.int64(i) for i in ids],
    "whole floats": lambda ids: [float(i) for i in ids],
    "float array": lambda ids: numpy.array(ids, dtype=numpy.float64),
    "int64 array": lambda ids: numpy.array(ids, dtype=numpy.int64),
    "str array": lambda ids: numpy.array([str(i) for i in ids]),
    "object array": lambda ids: mixed_objects(ids),
    "torch tensor": lambda ids: torch.tensor(ids, dtype=torch.int64),
    "tuple": lambda ids: tuple(int(i) for i in ids),
}  # fmt: skip
LENGTH_FORMS = {
    "ints": lambda lengths: [int(n) for n in lengths],
    "numpy array": lambda lengths: numpy.array(lengths),
    "numpy scalars": lambda lengths: [numpy.int32(n) for n in lengths],
    "whole floats": lambda lengths: [float(n) for n in lengths],
    "tuple": lambda lengths: tuple(lengths),
}  # (the seed refuses digit-string lengths: it multiplies them by the item size)


def build_here(prefix: str, dtype: str, documents: list) -> None:
    builder = megafmt.IndexedDatasetBuilder(prefix + ".bin", dtype=numpy.dtype(dtype).type)
    for tokens, lengths in documents:
        builder.add_document(tokens, lengths)
    builder.finalize(prefix + ".idx")


def test_ids_numpy_converts_exactly_give_the_seed_s_bytes(seed, tmp_path: Path) -> None:
    rng = numpy.random.default_rng(2024)
    for case in range(8):
        dtype = str(rng.choice(["uint16", "int32", "int64", "uint8"]))
        high = min(numpy.iinfo(dtype).max, 2**40)
        documents = []
        for _ in range(int(rng.integers(1, 25))):
            lengths = rng.integers(0, 12, int(rng.integers(1, 4))).tolist()
            ids = rng.integers(0, high, sum(lengths), endpoint=True).tolist()
            tokens = TOKEN_FORMS[str(rng.choice(list(TOKEN_FORMS)))](ids)
            documents.append((tokens, LENGTH_FORMS[str(rng.choice(list(LENGTH_FORMS)))](lengths)))
        theirs, ours = str(tmp_path / f"seed{case}"), str(tmp_path / f"ours{case}")
        seed.call("seed_names:build", theirs, dtype, documents)
        build_here(ours, dtype, documents)
        for suffix in (".bin", ".idx"):
            assert Path(ours + suffix).read_bytes() == Path(theirs + suffix).read_bytes(), (
                case,
                dtype,
                suffix,
            )


REFUSED = [
    ("uint16", [70000], [1]),  # wraps
    ("uint16", [-1], [1]),
    ("uint8", ["256"], [1]),
    ("int32", [1.5], [1]),  # loses the fraction
    ("int32", [float("nan")], [1]),
    ("int64", [2.0**63], [1]),
    ("int32", ["1.5"], [1]),
    ("int32", ["12a"], [1]),
    ("int32", [1, 2], [1.5, 0.5]),  # a length that loses its fraction
    ("int32", [1, 2], ["2", "x"]),
]


@pytest.mark.parametrize("dtype,tokens,lengths", REFUSED)
def test_ids_that_would_change_are_refused(seed, tmp_path: Path, dtype, tokens, lengths) -> None:
    theirs = str(tmp_path / "seed")
    try:
        seed.call("seed_names:build", theirs, dtype, [(tokens, lengths)])
    except SeedRaised:
        pass  # refused there too
    else:  # the seed took it, and what it wrote is not what it was given
        written = numpy.fromfile(theirs + ".bin", dtype=dtype).tolist()
        index = megafmt._IndexReader(theirs + ".idx", False)
        given = [float(t) for t in tokens]
        assert written != given or index.sequence_lengths.tolist() != [float(n) for n in lengths]
    with pytest.raises(megafmt.TokenValueError):
        build_here(str(tmp_path / "ours"), dtype, [(tokens, lengths)])

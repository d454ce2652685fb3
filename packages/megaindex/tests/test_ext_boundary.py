"""The private extension refuses, by itself, every array it cannot use as it is: no argument is
converted into a temporary copy (an output filled there would never reach the caller) and no
shape or value lets it read or write outside an array, whoever calls it. Its typed stub ships
with it and matches it."""

import ast
import importlib
import importlib.resources

import numpy
import pytest

ext = importlib.import_module("megaindex._ext")


def test_an_output_of_another_dtype_is_refused_not_filled_in_a_copy():
    weights = numpy.array([0.5, 0.5])
    dataset_index = numpy.zeros(4, numpy.int32)  # int16 expected
    with pytest.raises(TypeError):
        ext.build_blending_indices(weights, dataset_index, numpy.zeros(4, numpy.int64))
    assert dataset_index.tolist() == [0, 0, 0, 0]


def gather_windows(*arguments):
    """The extension's WindowGatherer, made and called once with gather_windows' arguments
    (the tables, then the batch: samples and out)."""
    *tables, samples, extra, out = arguments
    return ext.WindowGatherer(*tables, extra).gather(samples, out)


def gather_arguments() -> list:
    """Valid arguments of gather_windows: documents of 4 and 6 uint16 tokens, two samples."""
    return [
        numpy.arange(10, dtype=numpy.uint16),  # tokens
        numpy.array([0, 8], numpy.int64),  # pointers
        numpy.array([4, 6], numpy.int32),  # lengths
        numpy.array([1, 0], numpy.int32),  # document_index
        numpy.array([[0, 0], [0, 2], [1, 1]], numpy.int32),  # sample_index
        numpy.array([1, 0], numpy.uint32),  # shuffle_index
        [0, 1],  # samples: a list, as each batch gives them
        1,  # extra
        numpy.zeros((2, 10), numpy.int64),  # out
    ]


# every binding with valid arguments (arrays of two entries at least: numpy calls a one-entry
# array contiguous whatever its stride) and the positions of its outputs
BINDINGS = {
    "build_sample_index_int32": (
        lambda: [numpy.array([3, 2], numpy.int32), numpy.zeros(2, numpy.int32), 2, 1, 0],
        (),
    ),
    "build_sample_index_int64": (
        lambda: [numpy.array([3, 2], numpy.int32), numpy.zeros(2, numpy.int32), 2, 1, 0],
        (),
    ),
    "fill_sample_index": (
        lambda: [
            numpy.array([3, 2], numpy.int32),
            numpy.zeros(2, numpy.int32),
            2,
            0,
            numpy.zeros((3, 2), numpy.int32),
            0,
            3,
        ],
        (4,),
    ),
    "build_gpt_tables": (
        lambda: [
            numpy.array([3, 2], numpy.int32),
            numpy.array([0, 1], numpy.int32),
            2,
            True,
            7,
            2,
            1,
            4,
            2,
            False,
            False,
        ],
        (),
    ),
    "legacy_shuffle": (
        lambda: [
            numpy.random.RandomState(0).get_state()[1],
            0,
            numpy.arange(5, dtype=numpy.int64),
        ],
        (0, 2),
    ),
    "build_blending_indices": (
        lambda: [numpy.array([0.5, 0.5]), numpy.zeros(3, numpy.int16), numpy.zeros(3, numpy.int64)],
        (1, 2),
    ),
    "build_exhaustive_blending_indices": (
        lambda: [
            numpy.array([1, 2], numpy.int64),
            numpy.zeros(3, numpy.int16),
            numpy.zeros(3, numpy.int64),
        ],
        (1, 2),
    ),
    "fill_document_causal_mask": (
        lambda: [numpy.array([0, 0, 2], numpy.int64), numpy.zeros((3, 3), numpy.bool_), 1],
        (1,),
    ),
    "gather_windows": (gather_arguments, (8,)),
    "fim_assemble": (
        lambda: [
            numpy.arange(4, dtype=numpy.int64),
            numpy.array([7, 8], numpy.int64),
            numpy.array([[0, 0, 2], [1, 0, 2]], numpy.int64),
            numpy.zeros(5, numpy.int64),
            -1,
        ],
        (3,),
    ),
}


def strided(array: numpy.ndarray) -> numpy.ndarray:
    """The same values, not contiguous."""
    return numpy.repeat(array, 2, axis=-1)[..., ::2]


def other_dtype(array: numpy.ndarray) -> numpy.ndarray:
    return array.astype(numpy.float32 if array.dtype.kind in "iub" else numpy.int64)


@pytest.mark.parametrize("name", BINDINGS)
def test_no_array_argument_is_converted(name):
    make, outputs = BINDINGS[name]
    function = gather_windows if name == "gather_windows" else getattr(ext, name)
    function(*make())  # as given, accepted
    for position, argument in enumerate(make()):
        if not isinstance(argument, numpy.ndarray):
            continue
        for wrong in (other_dtype(argument), strided(argument)):
            assert not (wrong.dtype == argument.dtype and wrong.flags.c_contiguous)
            arguments = make()
            arguments[position] = wrong
            before = wrong.copy()
            with pytest.raises(TypeError):
                function(*arguments)
            numpy.testing.assert_array_equal(wrong, before)
        if position in outputs:
            arguments = make()
            arguments[position].flags.writeable = False
            with pytest.raises(TypeError):
                function(*arguments)


def test_a_mask_smaller_than_its_segment_starts_is_refused():
    starts = numpy.zeros(64, numpy.int64)
    for shape in [(8, 8), (64, 8), (8, 64), (65, 65)]:
        with pytest.raises(ValueError, match=rf"out must have shape \(64, 64\).*got \({shape[0]}"):
            ext.fill_document_causal_mask(starts, numpy.zeros(shape, numpy.bool_), 1)


def test_segment_starts_outside_their_row_are_refused_before_writing():
    out = numpy.zeros((3, 3), numpy.bool_)
    for starts, message in [
        ([0, 2, 0], r"segment_start\[1\] = 2 is outside 0\.\.1"),
        ([0, 0, -1], r"segment_start\[2\] = -1 is outside 0\.\.2"),
    ]:
        with pytest.raises(IndexError, match=message):
            ext.fill_document_causal_mask(numpy.array(starts, numpy.int64), out, 2)
    assert not out.any()


def test_blending_outputs_must_hold_every_entry_written():
    weights = numpy.array([0.5, 0.5])
    with pytest.raises(ValueError, match="must both hold 4 entries, got 4 and 3"):
        ext.build_blending_indices(
            weights, numpy.zeros(4, numpy.int16), numpy.zeros(3, numpy.int64)
        )
    sizes = numpy.array([2, 3], numpy.int64)
    with pytest.raises(ValueError, match="must both hold 5 entries, got 4 and 5"):
        ext.build_exhaustive_blending_indices(
            sizes, numpy.zeros(4, numpy.int16), numpy.zeros(5, numpy.int64)
        )
    # a dataset of size 0 would never leave the draw: the loop would run past the outputs
    with pytest.raises(ValueError, match=r"sizes\[1\] = 0: sizes must be positive"):
        ext.build_exhaustive_blending_indices(
            numpy.array([2, 0], numpy.int64),
            numpy.zeros(2, numpy.int16),
            numpy.zeros(2, numpy.int64),
        )
    with pytest.raises(ValueError, match="needs 1..32767 datasets"):
        ext.build_blending_indices(
            numpy.zeros(0), numpy.zeros(2, numpy.int16), numpy.zeros(2, numpy.int64)
        )


def test_scalars_that_would_crash_or_read_outside_are_refused():
    with pytest.raises(ValueError, match="sequence_length >= 1"):  # integer division by zero
        ext.sample_count(1, 100, 0, True, 0)
    with pytest.raises(ValueError, match="product an int64"):
        ext.sample_count(2**30, 2**40, 8, True, 0)
    key = numpy.random.RandomState(0).get_state()[1]
    with pytest.raises(ValueError, match="pos be in 0..624, got 624 words and pos 625"):
        ext.legacy_shuffle(key, 625, numpy.arange(4, dtype=numpy.int64))
    sizes = numpy.array([3], numpy.int32)
    with pytest.raises(ValueError, match="document_index is empty"):
        ext.build_sample_index_int32(sizes, numpy.zeros(0, numpy.int32), 2, 1, 0)
    with pytest.raises(ValueError, match="num_samples >= 0"):
        ext.build_sample_index_int64(sizes, numpy.zeros(1, numpy.int32), 2, -5, 0)
    documents = numpy.zeros(2, numpy.int32)
    for epochs, first, samples, message in [
        (0, 1, 1, "got 0, 2, 0, 1, 1"),  # no epoch
        (1, 3, 2, "got 1, 2, 0, 3, 2"),  # more samples first than in all
        (1, -1, 2, "got 1, 2, 0, -1, 2"),
    ]:
        with pytest.raises(ValueError, match=message):
            ext.build_gpt_tables(
                sizes, documents, epochs, False, 0, 2, 0, samples, first, False, False
            )
    with pytest.raises(ValueError, match="documents is empty"):
        ext.build_gpt_tables(sizes, documents[:0], 1, False, 0, 2, 0, 1, 1, False, False)
    with pytest.raises(IndexError, match=r"document_index\[\d\] = 0 is not a document id"):
        ext.build_gpt_tables(sizes[:0], documents, 1, False, 0, 2, 0, 1, 1, False, False)


@pytest.mark.parametrize(
    "first_row, last_row, message",
    [
        (2, 1, "first_row <= last_row <= 4"),
        (0, 5, r"last_row <= 4 \(out's rows\)"),
        (-1, 2, "0 <= first_row"),
    ],
)
def test_sample_index_rows_outside_out_are_refused(first_row, last_row, message):
    out = numpy.zeros((4, 2), numpy.int64)
    with pytest.raises(ValueError, match=message):
        ext.fill_sample_index(
            numpy.array([3], numpy.int32),
            numpy.zeros(2, numpy.int32),
            2,
            0,
            out,
            first_row,
            last_row,
        )


def test_a_walk_resumed_outside_the_document_index_is_refused():
    sizes, document_index = numpy.array([3], numpy.int32), numpy.zeros(2, numpy.int32)
    out = numpy.array([[0, 0], [2, 0], [0, 0]], numpy.int32)  # row 1: position 2 of 2
    with pytest.raises(IndexError, match=r"out\[1\] holds position 2, outside .* 2 entries"):
        ext.fill_sample_index(sizes, document_index, 2, 0, out, 2, 3)
    with pytest.raises(ValueError, match="document_index is empty"):
        ext.fill_sample_index(sizes, numpy.zeros(0, numpy.int32), 2, 0, out, 0, 3)
    with pytest.raises(IndexError, match=r"document_index\[1\] = 5 is not a document id"):
        ext.fill_sample_index(sizes, numpy.array([0, 5], numpy.int32), 2, 0, out, 0, 3)


def test_gather_windows_shapes_are_checked():
    arguments = gather_arguments()
    arguments[8] = numpy.zeros((3, 10), numpy.int64)
    with pytest.raises(ValueError, match=r"out must have a row per sample \(2\), got 3"):
        gather_windows(*arguments)
    arguments = gather_arguments()
    arguments[2] = numpy.array([4, 6, 1], numpy.int32)
    with pytest.raises(ValueError, match="pointers and lengths .* got 2 and 3"):
        gather_windows(*arguments)
    arguments = gather_arguments()
    arguments[7] = 2
    with pytest.raises(ValueError, match="extra must be 0 or 1, got 2"):
        gather_windows(*arguments)
    arguments = gather_arguments()
    arguments[4] = numpy.zeros((3, 3), numpy.int32)
    with pytest.raises(TypeError):  # two columns, or it is not a sample index
        gather_windows(*arguments)
    for position, name, found in [
        (0, "tokens", "float32"),
        (4, "sample_index", "uint32"),
        (5, "shuffle_index", "int32"),
    ]:
        arguments = gather_arguments()
        arguments[position] = arguments[position].astype(found)
        with pytest.raises(TypeError, match=f"{name} must be .*, got {found}"):
            gather_windows(*arguments)


def test_gather_windows_accepts_every_table_dtype():
    # document 0 is tokens 0..3, document 1 tokens 4..9; the stream is document 1, then 0
    expected = numpy.full((2, 10), -1, numpy.int64)
    # row 0: sample 0 is sample_index rows 1..2, document 1 from 2 then document 0 up to 1 + 1
    expected[0, :6] = [6, 7, 8, 9, 0, 1]
    # row 1: sample 1 is rows 0..1, document 1 from 0 up to 2 + 1
    expected[1, :3] = [4, 5, 6]
    for tokens in ("uint8", "int8", "int16", "uint16", "int32", "int64"):
        for positions in ("int32", "int64"):
            for order in ("uint32", "int64"):
                arguments = gather_arguments()
                arguments[0] = arguments[0].astype(tokens)
                arguments[1] = numpy.array([0, 4 * arguments[0].itemsize], numpy.int64)
                arguments[4] = arguments[4].astype(positions)
                arguments[5] = arguments[5].astype(order)
                arguments[8][:] = -1
                written = gather_windows(*arguments)
                assert written == [6, 3]
                numpy.testing.assert_array_equal(arguments[8], expected)


def signature_parameters(signature: str) -> list[str]:
    """The parameter names of a nanobind signature ``def f(a: T[...], b: int) -> R``."""
    inner = signature[signature.index("(") + 1 : signature.rindex(") ->")]
    names, depth, start = [], 0, 0
    for position, character in enumerate(inner + ","):
        depth += character in "[("
        depth -= character in "])"
        if character == "," and depth == 0:
            names.append(inner[start:position].split(":")[0].strip())
            start = position + 1
    return [name for name in names if name]


def test_the_typed_stub_ships_and_matches_the_module():
    stub = importlib.resources.files("megaindex").joinpath("_ext.pyi").read_text()
    stubbed: dict[str, list[list[str]]] = {}
    for node in ast.parse(stub).body:
        methods = [(node.name, node)] if isinstance(node, ast.FunctionDef) else []
        if isinstance(node, ast.ClassDef):
            methods = [
                (f"{node.name}.{item.name}", item)
                for item in node.body
                if isinstance(item, ast.FunctionDef)
            ]
        for name, function in methods:
            stubbed.setdefault(name, []).append([a.arg for a in function.args.args])
    functions = {}
    for name, value in vars(ext).items():
        if isinstance(value, type):
            methods = list(vars(value))  # the extension's own: those it gave a signature
            functions.update(
                (f"{name}.{method}", getattr(value, method))
                for method in methods
                if hasattr(getattr(value, method), "__nb_signature__")
            )
        elif not name.startswith("_") and callable(value):
            functions[name] = value
    built = {
        name: [signature_parameters(overload[0]) for overload in function.__nb_signature__]
        for name, function in functions.items()
    }
    assert set(built) == {
        "build_blending_indices",
        "build_exhaustive_blending_indices",
        "build_gpt_tables",
        "build_sample_index_int32",
        "build_sample_index_int64",
        "fill_document_causal_mask",
        "fill_sample_index",
        "fim_assemble",
        "BlendGatherer.__init__",
        "BlendGatherer.gather",
        "WindowGatherer.__init__",
        "WindowGatherer.gather",
        "FileBytes.join",
        "FileBytes.__bytes__",
        "FileWriterPool.__init__",
        "FileWriterPool.submit",
        "FileWriterPool.submit_tables",
        "FileWriterPool.close",
        "PendingWrite.wait",
        "legacy_shuffle",
        "sample_count",
        "write_files",
    }
    assert stubbed == built


def test_a_blend_gatherer_refuses_what_is_not_a_window_gatherer():
    *tables, _samples, extra, _out = gather_arguments()
    part = ext.WindowGatherer(*tables, extra)
    index, samples = numpy.zeros(2, numpy.int16), numpy.zeros(2, numpy.int64)
    for wrong in (None, object(), "part"):
        with pytest.raises(TypeError):
            ext.BlendGatherer([part, wrong], index, samples)
    blend = ext.BlendGatherer([part], index, samples)
    out = numpy.zeros((1, 10), numpy.int64)
    assert blend.gather([1], out) == [6]  # sample 0 of the part: document 1 from 2, then 0

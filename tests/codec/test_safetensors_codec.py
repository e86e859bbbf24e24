"""The safetensors codec (numpy only): bytes equal to the reference writer's, odd but valid
headers read, hostile headers refused with typed errors in bounded memory."""

from __future__ import annotations

import io
import json
import struct
import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from tlckpt.codec import (
    CheckpointError,
    ConfigError,
    FileTooLargeError,
    MalformedError,
    SchemaMismatchError,
    TrailingDataError,
    TruncatedError,
    inspect,
    read_metadata,
    sniff_family,
)
from tlckpt.codec.safetensors import (
    SafetensorsReader,
    TensorData,
    read_safetensors,
    write_safetensors,
)
from tlckpt.formats.safetensors import DTYPES

torch = pytest.importorskip("torch")
st = pytest.importorskip("safetensors.torch")

NAMES = ["plain", "ünïcödé ✓", 'quo"te', "back\\slash", "ctl\n\t\x01\x7f", "", "a/b.c[0]"]


def _ours(tensors: dict, metadata: dict | None) -> bytes:
    out = io.BytesIO()
    items = {}
    for name, t in tensors.items():
        word = next(d.name for d in DTYPES if d.torch and getattr(torch, d.torch, None) == t.dtype)
        shape = list(t.shape)
        if word == "F4":
            shape[-1] *= 2
        raw = t.contiguous().reshape(-1).view(torch.uint8).numpy()
        items[name] = TensorData(word, shape, raw)
    write_safetensors(out, items, metadata=metadata)
    return out.getvalue()


def _random(dtype, shape, seed: int):
    g = torch.Generator().manual_seed(seed)
    width = torch.empty(0, dtype=dtype).element_size()
    count = int(np.prod(shape, dtype=np.int64)) * width
    raw = torch.randint(0, 256, (count,), dtype=torch.uint8, generator=g)
    if dtype == torch.bool:
        raw = raw % 2
    return raw.view(dtype).reshape(shape)


def _raw(t) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def _pairs(data: bytes) -> list:
    n = struct.unpack_from("<Q", data)[0]
    return json.loads(data[8 : 8 + n], object_pairs_hook=list)


def _data_size(data: bytes) -> int:
    return len(data) - 8 - struct.unpack_from("<Q", data)[0]


TORCH_DTYPES = [getattr(torch, d.torch) for d in DTYPES if d.torch and hasattr(torch, d.torch)]


@pytest.mark.parametrize("dtype", TORCH_DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(), (0,), (3, 0, 2), (2, 3, 2, 4), (5,)], ids=str)
def test_bytes_equal_the_reference_writer(dtype, shape) -> None:
    if dtype == getattr(torch, "float4_e2m1fn_x2", None) and not shape:
        pytest.skip("a rank-0 float4 pair has no last dim to double")
    tensors = {name: _random(dtype, shape, i) for i, name in enumerate(NAMES)}
    metadata = {"format": "pt", "ünï": 'q"\\\n'}
    for md in (None, metadata, {"one": "1"}):
        ref = st.save(tensors, metadata=md)
        ours = _ours(tensors, md)
        if md is not None and len(md) > 1:  # the reference's metadata order is its hash map's
            assert len(ours) == len(ref)
            h1, h2 = (_pairs(b) for b in (ours, ref))
            assert dict(h1[0][1]) == dict(h2[0][1]) and h1[1:] == h2[1:]
            assert ours[-_data_size(ours) or len(ours) :] == ref[-_data_size(ref) or len(ref) :]
        else:
            assert ours == ref


def test_mixed_dtypes_and_names_equal_the_reference() -> None:
    tensors = {
        f"{name}{i}": _random(dtype, (2, 3), i)
        for i, (name, dtype) in enumerate(zip(NAMES * 4, TORCH_DTYPES))
    }
    assert _ours(tensors, None) == st.save(tensors)
    assert _ours({}, None) == st.save({})


def test_empty_metadata_without_tensors_is_valid_json() -> None:
    # The reference writes b'{},"__metadata__":{}}' here (invalid JSON it cannot read back);
    # we write the valid header it means.
    data = _ours({}, {})
    assert data[8:].rstrip() == b'{"__metadata__":{}}'
    header, arrays = read_safetensors(io.BytesIO(data))
    assert header.metadata == {} and arrays == {}


def test_reads_reference_files_exactly() -> None:
    tensors = {f"t{i}": _random(dt, (3, 4), i) for i, dt in enumerate(TORCH_DTYPES)}
    data = st.save(tensors, metadata={"k": "v"})
    header, arrays = read_safetensors(io.BytesIO(data))
    assert header.metadata == {"k": "v"}
    for name, t in tensors.items():
        assert (
            arrays[name].tobytes() == t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        )
    assert read_metadata(io.BytesIO(data)) == {"k": "v"}
    assert sniff_family(io.BytesIO(data)) == "safetensors"
    assert inspect(io.BytesIO(data))["family"] == "safetensors"


# ---------------------------------------------------------------- odd but valid headers


def _file(header: bytes | str, data: bytes = b"") -> bytes:
    if isinstance(header, str):
        header = header.encode()
    return struct.pack("<Q", len(header)) + header + data


ODD = {
    "pretty": json.dumps(
        {"__metadata__": {"a": "b"}, "x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}},
        indent=2,
    ),
    "unpadded": '{"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}',
    "metadata_last": '{"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"__metadata__":{}}',
    "metadata_null": '{"__metadata__":null,"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}',
    "keys_out_of_order": '{"x":{"data_offsets":[0,8],"shape":[2],"dtype":"F32"}}',
    "entries_out_of_offset_order": (
        '{"y":{"dtype":"U8","shape":[4],"data_offsets":[4,8]},'
        '"x":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}}'
    ),
    "zero_size_at_one_offset": (
        '{"e":{"dtype":"F64","shape":[0],"data_offsets":[8,8]},'
        '"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},'
        '"f":{"dtype":"I8","shape":[3,0],"data_offsets":[8,8]}}'
    ),
    "colons_everywhere": (
        '{"__metadata__":{"a:b":"c::d","":":"},'
        '"x:y":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}'
    ),
    "escaped_name": '{"\\u00e9\\"":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}',
    "much_padding": '{"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}' + " " * 100,
    "tabs_and_newlines": (
        '{\n\t"x" : {"dtype" : "F32", "shape" : [2], "data_offsets" : [0, 8]}\r\n}'
    ),
}


@pytest.mark.parametrize("name", sorted(ODD))
def test_odd_valid_headers_read_as_the_reference_reads_them(name: str) -> None:
    data = _file(ODD[name], bytes(range(8)))
    _, arrays = read_safetensors(io.BytesIO(data))
    ref = st.load(data)
    assert set(arrays) == set(ref)
    for key, t in ref.items():
        assert (
            arrays[key].tobytes() == t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        )


# ---------------------------------------------------------------- hostile headers


def _entry(dtype="F32", shape=(2,), offsets=(0, 8)) -> dict:
    return {"dtype": dtype, "shape": list(shape), "data_offsets": list(offsets)}


def _doc(doc: object, data: bytes = bytes(8)) -> bytes:
    return _file(json.dumps(doc), data)


HOSTILE: dict[str, tuple[bytes, type[CheckpointError]]] = {
    "empty": (b"", TruncatedError),
    "short_length": (b"\x05\x00\x00", TruncatedError),
    "length_beyond_file": (struct.pack("<Q", 1000) + b"{}", TruncatedError),
    "length_over_limit": (struct.pack("<Q", 100_000_001) + b"{}", FileTooLargeError),
    "length_u64_max": (b"\xff" * 8 + b"{}", FileTooLargeError),
    "length_zero": (struct.pack("<Q", 0), MalformedError),
    "not_an_object": (_file("[1, 2]"), MalformedError),
    "whitespace_only": (_file("        "), MalformedError),
    "not_utf8": (_file(b'{"\xff\xfe":1}'), MalformedError),
    "broken_json": (_file('{"x": {'), MalformedError),
    "trailing_garbage": (_file("{} x"), MalformedError),
    "deep_nesting": (_file('{"x":' + "[" * 5000 + "]" * 5000 + "}"), MalformedError),
    "duplicate_name": (
        _file(
            '{"x":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},'
            '"x":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}}',
            bytes(8),
        ),
        MalformedError,
    ),
    "duplicate_metadata": (
        _file('{"__metadata__":{},"__metadata__":{"a":"b"}}'),
        MalformedError,
    ),
    "duplicate_escaped_name": (
        _file(
            '{"x":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},'
            '"\\u0078":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}}',
            bytes(8),
        ),
        MalformedError,
    ),
    "duplicate_name_with_colons": (
        _file(
            '{"a:b":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},'
            '"a:b":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}}',
            bytes(8),
        ),
        MalformedError,
    ),
    "duplicate_name_first_not_an_entry": (
        _file('{"x":1,"x":{"dtype":"U8","shape":[8],"data_offsets":[0,8]}}', bytes(8)),
        MalformedError,
    ),
    "duplicate_metadata_key": (
        _file('{"__metadata__":{"k":"a","k":"b"}}'),
        MalformedError,
    ),
    "duplicate_entry_key": (
        _file('{"x":{"dtype":"F32","dtype":"F32","shape":[2],"data_offsets":[0,8]}}', bytes(8)),
        MalformedError,
    ),
    "entry_not_object": (_doc({"x": 1}), MalformedError),
    "entry_missing_dtype": (_doc({"x": {"shape": [2], "data_offsets": [0, 8]}}), MalformedError),
    "entry_extra_member": (_doc({"x": {**_entry(), "extra": 1}}), MalformedError),
    "unknown_dtype": (_doc({"x": _entry(dtype="F128")}), ConfigError),
    "dtype_not_string": (_doc({"x": _entry(dtype=4)}), ConfigError),
    "dtype_lowercase": (_doc({"x": _entry(dtype="f32")}), ConfigError),
    "shape_not_list": (_doc({"x": {**_entry(), "shape": 2}}), MalformedError),
    "shape_negative": (_doc({"x": _entry(shape=(-2,))}), MalformedError),
    "shape_float": (_doc({"x": _entry(shape=(2.0,))}), MalformedError),
    "shape_bool": (_doc({"x": _entry(shape=(True, 2))}), MalformedError),
    "shape_string": (_doc({"x": _entry(shape=("2",))}), MalformedError),
    "shape_overflow": (
        _doc({"x": _entry(shape=(2**63, 2**63), offsets=(0, 0))}, b""),
        SchemaMismatchError,
    ),
    "shape_past_u64": (
        _file('{"x":{"dtype":"U8","shape":[18446744073709551616],"data_offsets":[0,0]}}'),
        MalformedError,
    ),
    "offsets_three": (_doc({"x": _entry(offsets=(0, 4, 8))}), MalformedError),
    "offsets_strings": (_doc({"x": _entry(offsets=("0", "8"))}), MalformedError),
    "offsets_reversed": (_doc({"x": _entry(offsets=(8, 0))}), SchemaMismatchError),
    "offsets_wrong_length": (_doc({"x": _entry(offsets=(0, 6))}, bytes(6)), SchemaMismatchError),
    "offsets_past_end": (_doc({"x": _entry(shape=(2**40,), offsets=(0, 2**42))}), TruncatedError),
    "offsets_u64_max": (
        _doc({"x": _entry(dtype="U8", shape=(2**64 - 1,), offsets=(0, 2**64 - 1))}),
        TruncatedError,
    ),
    "first_not_at_zero": (_doc({"x": _entry(offsets=(4, 12))}, bytes(12)), SchemaMismatchError),
    "overlap": (
        _doc({"x": _entry("U8", (4,), (0, 4)), "y": _entry("U8", (4,), (2, 6))}, bytes(6)),
        SchemaMismatchError,
    ),
    "gap": (
        _doc({"x": _entry("U8", (4,), (0, 4)), "y": _entry("U8", (4,), (6, 10))}, bytes(10)),
        SchemaMismatchError,
    ),
    "truncated_data": (_doc({"x": _entry()}, bytes(5)), TruncatedError),
    "trailing_data": (_doc({"x": _entry()}, bytes(9)), TrailingDataError),
    "metadata_string": (_doc({"__metadata__": "x"}, b""), MalformedError),
    "metadata_int_value": (_doc({"__metadata__": {"a": 1}}, b""), MalformedError),
    "metadata_nested": (_doc({"__metadata__": {"a": {"b": "c"}}}, b""), MalformedError),
    "f4_half_byte": (_doc({"x": _entry("F4", (3,), (0, 2))}, bytes(2)), SchemaMismatchError),
    "f6_odd_bits": (_doc({"x": _entry("F6_E2M3", (5,), (0, 4))}, bytes(4)), SchemaMismatchError),
    "nul_in_header": (_file(b'{"x\x00":1}'), MalformedError),
}


def test_at_least_thirty_kinds_of_hostile_headers() -> None:
    assert len(HOSTILE) >= 30


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_headers_are_refused_in_bounded_memory(name: str) -> None:
    data, error = HOSTILE[name]
    tracemalloc.start()
    try:
        with pytest.raises(error) as info:
            read_safetensors(io.BytesIO(data))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert isinstance(info.value, CheckpointError)
    assert peak < (1 << 20) + 4 * len(data), peak
    with pytest.raises(CheckpointError):
        read_metadata(io.BytesIO(data))


def test_hostile_header_errors_say_where() -> None:
    with pytest.raises(SchemaMismatchError) as info:
        read_safetensors(io.BytesIO(HOSTILE["overlap"][0]))
    assert info.value.offset == 8 and "data_offsets" in info.value.field


def test_lazy_reader_reads_one_tensor_into_a_buffer(tmp_path) -> None:
    path = tmp_path / "x.safetensors"
    a = np.arange(12, dtype="<f4").reshape(3, 4)
    b = np.arange(5, dtype="<i8")
    write_safetensors(path, {"a": a, "b": b}, metadata={"m": "1"})
    with SafetensorsReader(path) as f:
        assert list(f.header.entries) == ["b", "a"]
        out = np.empty(5, dtype="<i8")
        f.read_into("b", out)
        assert (out == b).all()
        assert (f.array("a") == a.view("<u4")).all()
        with pytest.raises(SchemaMismatchError):
            f.array("missing")


def test_writer_refuses_before_writing(tmp_path) -> None:
    path = tmp_path / "x.safetensors"
    path.write_bytes(b"old")
    with pytest.raises(CheckpointError):
        write_safetensors(path, {"a": TensorData("F32", (2,), np.zeros(3, "<f4"))})
    assert path.read_bytes() == b"old"
    with pytest.raises(CheckpointError):
        write_safetensors(path, {"a": np.zeros(2, "<f4")}, metadata={"k": 1})  # type: ignore[dict-item]
    with pytest.raises(CheckpointError):
        write_safetensors(path, {"a": TensorData("F128", (2,), b"")})
    with pytest.raises(CheckpointError):
        write_safetensors(path, {"__metadata__": np.zeros(2, "<f4")})
    with pytest.raises(CheckpointError):
        write_safetensors(path, {"\ud800": np.zeros(2, "<f4")})
    assert path.read_bytes() == b"old"


def test_writer_streams_into_a_set_member_s_digesting_writer(tmp_path) -> None:
    from tlckpt.codec.set_digests import DigestingWriter, hash_file

    path = tmp_path / "member.safetensors"
    with open(path, "wb") as raw:
        writer = DigestingWriter(raw)
        write_safetensors(writer, {"a": np.arange(1 << 19, dtype="<f4"), "b": np.zeros(3, "?")})
    with open(path, "rb") as f:
        assert hash_file(f, writer.size)[0] == writer.hexdigest()
    assert writer.size == path.stat().st_size


def test_writer_feeds_digests_every_byte(tmp_path) -> None:
    import hashlib

    path = tmp_path / "x.safetensors"
    digest = hashlib.sha256()
    write_safetensors(path, {"a": np.arange(4, dtype="<f8")}, digests=[digest])
    assert digest.digest() == hashlib.sha256(path.read_bytes()).digest()


# ---------------------------------------------------------------- properties


_TEXT = hs.text(hs.characters(exclude_categories=("Cs",)), max_size=12)


@settings(max_examples=60, deadline=None)
@given(
    hs.dictionaries(
        _TEXT.filter(lambda n: n != "__metadata__"),
        hs.tuples(
            hs.sampled_from(range(len(TORCH_DTYPES))),
            hs.lists(hs.integers(0, 3), min_size=1, max_size=3),
        ),
        max_size=6,
    ),
    hs.none() | hs.dictionaries(_TEXT, _TEXT, max_size=1),
)
def test_any_names_dtypes_and_shapes_equal_the_reference(spec, metadata) -> None:
    tensors = {
        name: _random(TORCH_DTYPES[k], tuple(shape), i)
        for i, (name, (k, shape)) in enumerate(spec.items())
    }
    data = _ours(tensors, metadata)
    if tensors or metadata != {}:  # that one case the reference writes as invalid JSON
        assert data == st.save(tensors, metadata=metadata)
    header, arrays = read_safetensors(io.BytesIO(data))
    assert set(arrays) == set(tensors) and header.metadata == metadata
    for name, t in tensors.items():
        assert arrays[name].tobytes() == _raw(t)


@pytest.mark.parametrize("name", sorted(HOSTILE) + [f"odd:{n}" for n in sorted(ODD)])
def test_the_reader_agrees_with_the_interpreted_prefix_spec(name: str) -> None:
    from construct import ConstructError

    from tlckpt.codec.safetensors import read_header
    from tlckpt.codec.source import open_source
    from tlckpt.formats.safetensors import SAFETENSORS_PREFIX

    data = _file(ODD[name[4:]], bytes(range(8))) if name.startswith("odd:") else HOSTILE[name][0]
    try:
        prefix = SAFETENSORS_PREFIX.parse(data)
    except ConstructError:
        prefix = None
    try:
        with open_source(io.BytesIO(data)) as src:
            header = read_header(src)
    except CheckpointError:
        header = None
    if prefix is None:  # the fixed part is refused by the spec: the reader refuses it too
        assert header is None
    if header is not None:
        assert prefix is not None and header.header_length == len(prefix.header)

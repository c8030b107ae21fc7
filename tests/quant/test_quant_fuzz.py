"""Fuzzing the safetensors header reader and the index's shard paths (hypothesis).

Whatever the bytes, reading a checkpoint ends in one of two ways: a clear Gemma4T4Error (with a
fix), or a tensor table that the format's reference implementation (the safetensors library)
also accepts, with every tensor's bytes where the header says. A repack of whatever was
accepted writes nothing outside its target, and nothing at all when it fails.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import tempfile
from pathlib import Path

import pytest

hypothesis = pytest.importorskip("hypothesis", reason="hypothesis is in the dev extra")
from hypothesis import HealthCheck, event, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from gemma4_t4.errors import Gemma4T4Error  # noqa: E402
from gemma4_t4.quant import open_checkpoint, repack  # noqa: E402
from gemma4_t4.quant.safetensors_io import DTYPES, INDEX_NAME  # noqa: E402

FUZZ = settings(
    max_examples=int(os.environ.get("GEMMA4_T4_FUZZ_EXAMPLES", "150")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8),
)
json_any = st.recursive(
    json_leaf,
    lambda kids: st.one_of(
        st.lists(kids, max_size=4), st.dictionaries(st.text(max_size=6), kids, max_size=4)
    ),
    max_leaves=12,
)
dims = st.lists(st.one_of(st.integers(0, 40), st.sampled_from([32, 64, -1, 2**40])), max_size=3)
dtype_names = st.one_of(
    st.sampled_from(sorted(DTYPES)), st.sampled_from(["F4", "C64", "bf16", ""]), json_leaf
)


@st.composite
def tensor_entries(draw):
    """A header that is valid, nearly valid (one field or offset nudged), or arbitrary JSON."""
    n = draw(st.integers(0, 4))
    broken = draw(st.booleans())  # half the files are valid: the accept path is checked as hard
    header: dict = {}
    cursor = 0
    for i in range(n):
        dtype = draw(st.sampled_from(["F32", "BF16", "F16", "I32", "U8"]))
        weights = st.tuples(st.integers(1, 4), st.sampled_from([32, 64])).map(list)
        shape = draw(
            st.one_of(weights, dims)
            if broken
            else st.one_of(weights, st.lists(st.integers(0, 9), max_size=3))
        )
        size = DTYPES[dtype].itemsize
        for d in shape:
            size *= max(d, 0)
        offsets: object = [cursor, cursor + size]
        mutation = (
            draw(st.sampled_from(["none", "offsets", "dtype", "shape", "entry", "drop", "shift"]))
            if broken
            else "none"
        )
        entry: object = {"dtype": dtype, "shape": shape, "data_offsets": offsets}
        if mutation == "offsets":
            entry["data_offsets"] = draw(
                st.one_of(json_any, st.lists(st.integers(-8, cursor + size + 8), max_size=3))
            )
        elif mutation == "dtype":
            entry["dtype"] = draw(dtype_names)
        elif mutation == "shape":
            entry["shape"] = draw(st.one_of(dims, json_any))
        elif mutation == "entry":
            entry = draw(json_any)
        elif mutation == "drop":
            entry.pop(draw(st.sampled_from(["dtype", "shape", "data_offsets"])))
        elif mutation == "shift":
            delta = draw(st.integers(-size - 4, 4))
            entry["data_offsets"] = [cursor + delta, cursor + delta + size]
        header[f"model.layers.{i}.mlp.up_proj.weight" if draw(st.booleans()) else f"t{i}"] = entry
        cursor += size
    if draw(st.booleans()):
        header["__metadata__"] = draw(st.one_of(st.just({"format": "pt"}), json_any))
    if broken and draw(st.integers(0, 5)) == 0:
        return draw(json_any), cursor, broken  # not even an object of entries
    return header, cursor, broken


@st.composite
def safetensors_files(draw):
    header, data_len, broken = draw(tensor_entries())
    raw = json.dumps(header).encode()
    pad = draw(st.sampled_from([0, 0, 0, 1, 3, 7]))
    raw += b" " * pad
    length = len(raw)
    if broken and draw(st.integers(0, 5)) == 0:
        length = draw(st.one_of(st.integers(0, 2**64 - 1), st.integers(max(0, length - 3), length + 3)))
    data_len = max(
        0, min(2**20, data_len) + (draw(st.sampled_from([0, -1, 1, -4, 16])) if broken else 0)
    )  # absurd shapes: short data
    # zeros and small numbers (a repack can write them) or random bytes (NaN, huge values ...)
    unit = draw(
        st.one_of(st.just(b"\0"), st.just(bytes([0, 0, 0x80, 0x3C])), st.binary(min_size=1, max_size=64))
    )
    data = (unit * (data_len // len(unit) + 1))[:data_len]
    blob = struct.pack("<Q", length) + raw + data
    if broken and draw(st.integers(0, 5)) == 0:  # cut and replace bytes anywhere
        cut = draw(st.integers(0, len(blob)))
        blob = blob[:cut] + draw(st.binary(max_size=16))
    return blob


def _reference(blob: bytes):
    """The safetensors library's reading of the same bytes, or None when it refuses them."""
    from safetensors import SafetensorError, deserialize

    try:
        return {name: (t["dtype"], list(t["shape"]), bytes(t["data"])) for name, t in deserialize(blob)}
    except SafetensorError:
        return None


def _tree(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_size for p in sorted(root.rglob("*")) if p.is_file()}


@FUZZ
@given(blob=safetensors_files())
def test_header_reader_gives_a_clear_error_or_the_reference_result(blob):
    with tempfile.TemporaryDirectory(prefix="gemma4-t4-fuzz-") as tmp:
        root = Path(tmp)
        ckpt = root / "ckpt"
        ckpt.mkdir()
        (ckpt / "model.safetensors").write_bytes(blob)
        (root / "keep.txt").write_text("outside the target")
        before = _tree(root)
        reference = _reference(blob)
        try:
            reader = open_checkpoint(ckpt)
        except Gemma4T4Error as exc:
            assert exc.message and exc.fix
            reader = None
        event("read: accepted" if reader is not None else "read: refused")
        if reader is not None:
            with reader:
                assert reference is not None, "accepted a file the safetensors library refuses"
                assert set(reader.tensors) == set(reference)
                for name, info in reader.tensors.items():
                    dtype, shape, data = reference[name]
                    assert (info.dtype, list(info.shape)) == (dtype, shape)
                    assert reader.read_rows(name).tobytes() == data
        try:
            repack(ckpt, root / "out", allow_requant=True)
            written = True
        except Gemma4T4Error:
            written = False
        event("repack: written" if written else "repack: refused")
        after = _tree(root)
        outside = {k: v for k, v in after.items() if not k.startswith("out/")}
        assert outside == before, "a write outside the target"
        assert written == (root / "out").is_dir()
        assert not [p for p in os.listdir(root) if ".partial-" in p]


shard_names = st.one_of(
    st.text(alphabet="./\\:ab~%", min_size=1, max_size=12),
    st.sampled_from(
        [
            "../x.safetensors",
            "../../x.safetensors",
            "/etc/passwd",
            "a/../../x.safetensors",
            "C:\\x.safetensors",
            "./model.safetensors",
            "sub/model.safetensors",
            "model.safetensors",
            "file:///etc/passwd",
            "..",
            ".",
        ]
    ),
    json_leaf,
)


@FUZZ
@given(name=shard_names)
def test_index_shard_paths_never_leave_the_folder(tiny_qat_model_dir, name):
    with tempfile.TemporaryDirectory(prefix="gemma4-t4-fuzz-") as tmp:
        root = Path(tmp)
        ckpt = root / "a" / "ckpt"
        ckpt.mkdir(parents=True)
        for bait in (root / "x.safetensors", root / "a" / "x.safetensors"):
            shutil.copy(tiny_qat_model_dir / "model.safetensors", bait)  # valid files just outside
        (ckpt / "sub").mkdir()
        shutil.copy(tiny_qat_model_dir / "model.safetensors", ckpt / "sub" / "model.safetensors")
        names = open_checkpoint(tiny_qat_model_dir).tensors
        # every tensor indexed into the drawn shard: a reader that followed it outside would succeed
        (ckpt / INDEX_NAME).write_text(json.dumps({"weight_map": dict.fromkeys(names, name)}))
        try:
            reader = open_checkpoint(ckpt)
        except Gemma4T4Error as exc:
            assert exc.message and exc.fix
            event("index: refused")
            return
        event("index: accepted")
        with reader:
            for shard in reader.shards:
                resolved = os.path.normpath(ckpt / shard)
                assert resolved.startswith(str(ckpt) + os.sep), shard

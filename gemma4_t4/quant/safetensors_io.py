"""Streaming access to (sharded) safetensors checkpoints, local or over HTTP range requests.

Tensors are read a block of rows at a time, so memory stays bounded (local ``preadv``; remote
``Range`` requests: one per shard for its header, then only the rows read).
Pickle checkpoints (``.bin``, ``.pt``) are refused and never opened: unpickling runs arbitrary code.
:class:`ShardedWriter` fixes every header up front, then writes blocks with ``pwrite`` into a
temporary directory that the caller renames into place.
"""

from __future__ import annotations

import errno
import http.client
import json
import math
import os
import struct
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gemma4_t4.errors import Gemma4T4Error

# safetensors dtype -> the numpy dtype that holds its raw bytes (its itemsize: bytes per element).
# BF16 and FP8 have no numpy dtype: they are carried as unsigned-integer bit patterns.
DTYPES: dict[str, np.dtype] = {name: np.dtype(code) for name, code in {
    "BF16": "<u2", "F16": "<f2", "F32": "<f4", "F64": "<f8", "I8": "i1", "U8": "u1", "I16": "<i2",
    "U16": "<u2", "I32": "<i4", "U32": "<u4", "I64": "<i8", "U64": "<u8", "BOOL": "?", "F8_E4M3": "u1",
    "F8_E5M2": "u1",
}.items()}


PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
MAX_HEADER_BYTES = 100 * 1024 * 1024  # the safetensors format's own limit


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor lives: its shard, dtype, shape and absolute byte range in the shard."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    shard: str
    start: int  # absolute offset in the shard file
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start

    @property
    def row_bytes(self) -> int:
        """Bytes per index of the first dimension."""
        return self.nbytes // self.shape[0] if self.shape and self.shape[0] else self.nbytes


def refuse_pickle(path: str) -> None:
    if str(path).lower().endswith(PICKLE_SUFFIXES):
        raise Gemma4T4Error(
            f"{path} is a pickle checkpoint; loading it would run arbitrary code, so it is never opened",
            fix="use the model's .safetensors files (most Hub repos have them), or convert the .bin to "
            "safetensors yourself in a sandbox you trust",
        )


def _unique_keys(pairs: list[tuple[str, object]]) -> dict:
    out = dict(pairs)
    if len(out) != len(pairs):
        raise ValueError("a key appears twice")
    return out


def _no_constants(token: str) -> float:
    raise ValueError(f"{token} is not JSON")  # Python's json accepts NaN/Infinity; the format does not


def _corrupt(shard: str, what: str) -> Gemma4T4Error:
    return Gemma4T4Error(f"{shard}: {what}", fix="the file is corrupt or not a safetensors file; re-download it")


def tensors_from_header(header: dict, data_start: int, shard: str, file_size: int | None) -> dict[str, TensorInfo]:
    """The tensor table of one shard, validated as the safetensors format requires: every entry an
    object with a known dtype, a shape of non-negative integers and ``data_offsets`` [begin, end]
    matching it; the tensors' byte ranges, in offset order, tile the data section exactly (no
    overlap, no gap, no shared range) and end where the file ends."""
    tensors: dict[str, TensorInfo] = {}
    meta_block = header.get("__metadata__")
    if meta_block is not None and not (isinstance(meta_block, dict)
                                       and all(isinstance(v, str) for v in meta_block.values())):
        raise _corrupt(shard, "__metadata__ is not an object of strings")
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        if not isinstance(meta, dict):
            raise _corrupt(shard, f"tensor {name!r} is described by {type(meta).__name__}, not an object")
        dtype, shape, offsets = meta.get("dtype"), meta.get("shape"), meta.get("data_offsets")
        if not isinstance(dtype, str) or dtype not in DTYPES:
            raise Gemma4T4Error(f"{shard}: tensor {name} has unsupported dtype {dtype}", fix="re-export the checkpoint")
        if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):  # not bool
            raise _corrupt(shard, f"tensor {name!r} has an invalid shape {shape!r}")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets)):
            raise _corrupt(shard, f"tensor {name!r} has invalid data_offsets {offsets!r} (need [begin, end])")
        begin, end = offsets
        expected = math.prod(shape) * DTYPES[dtype].itemsize  # Python ints: no overflow on absurd shapes
        if begin < 0 or end - begin != expected:
            raise Gemma4T4Error(
                f"{shard}: tensor {name} byte range {begin}..{end} does not match {dtype}{list(shape)}",
                fix="the file is corrupt; re-download it",
            )
        if file_size is not None and data_start + end > file_size:
            raise Gemma4T4Error(
                f"{shard}: tensor {name} ends past the end of the file (truncated download?)",
                fix="re-download the shard",
            )
        tensors[name] = TensorInfo(name, dtype, tuple(shape), shard, data_start + begin, data_start + end)
    cursor = data_start
    previous = None
    for info in sorted(tensors.values(), key=lambda t: (t.start, t.end)):
        if info.start != cursor:
            if info.start < cursor:
                raise _corrupt(shard, f"tensors {previous} and {info.name} overlap (their data_offsets share bytes)")
            raise _corrupt(shard, f"{info.start - cursor} bytes before tensor {info.name} belong to no tensor")
        cursor, previous = info.end, info.name
    if file_size is not None and cursor != file_size:
        raise _corrupt(shard, f"{file_size - cursor} bytes after the last tensor belong to no tensor")
    return tensors


def safe_shard_name(name: object, source: str) -> str:
    """A shard path from an index, refused unless it stays inside the checkpoint folder."""
    if not isinstance(name, str) or not name or "\x00" in name:
        raise Gemma4T4Error(f"{source}: {INDEX_NAME} names an invalid shard {name!r}", fix="re-download the index file")
    # an empty part is a leading, doubled or trailing slash (absolute paths and "://" URLs included)
    parts = name.replace("\\", "/").split("/")
    if "" in parts or ".." in parts or name[1:2] == ":":
        raise Gemma4T4Error(
            f"{source}: {INDEX_NAME} names the shard {name!r}, which is outside the checkpoint folder",
            fix="shard paths must be file names inside the folder; re-download the index from a source you trust",
        )
    return name


def missing_path_error(p: Path) -> Gemma4T4Error:
    """Why a checkpoint path cannot be opened: a symlink loop and a dangling symlink are named as
    such (``Path.exists`` is False for both, so "does not exist" would send the user looking for a
    file that is there)."""
    if p.is_symlink():
        try:
            os.stat(p)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                return Gemma4T4Error(f"{p} is a symlink loop (it leads back to itself: {exc.strerror})",
                                     fix="point the link at the real .safetensors file, or give that file's path")
        return Gemma4T4Error(f"{p} is a symlink to {os.readlink(p)}, which does not exist",
                             fix="point the link at the real file (an interrupted download or a moved cache "
                                 "leaves dangling links), or give the real path")
    return Gemma4T4Error(f"{p} does not exist", fix="check the checkpoint path")


class CheckpointReader:
    """A (sharded) safetensors checkpoint: its tensor table and block reads. Subclasses supply bytes:
    ``_read_into(shard, start, view)`` fills ``view`` from ``start``, ``_size(shard)`` (None: unknown),
    ``_exists(shard)`` and ``read_text(name)``, a small side file (config.json ...) or None."""

    def __init__(self, source: str):
        self.source = source
        self.tensors: dict[str, TensorInfo] = {}
        self.shards: list[str] = []

    # -- layout -------------------------------------------------------------------------
    @property
    def nbytes(self) -> int:  # every tensor's bytes: what a full read reads
        return sum(t.nbytes for t in self.tensors.values())

    def _load_folder(self) -> bool:
        """Load the folder's index, else its ``model.safetensors``; False when it has neither."""
        index_text = self.read_text(INDEX_NAME)
        if index_text is not None:
            self._load_index(index_text)
        elif self._exists(SINGLE_NAME):
            self._load_single(SINGLE_NAME)
        else:
            return False
        return True

    def _load_single(self, shard: str) -> None:
        self.shards = [shard]
        self.tensors = self._read_shard_header(shard)

    def _load_index(self, index_text: str) -> None:
        try:
            index = json.loads(index_text)
            weight_map: dict[str, str] = index["weight_map"]
            if not isinstance(weight_map, dict):
                raise TypeError("weight_map is not an object")
        except (ValueError, KeyError, TypeError, RecursionError) as exc:
            raise Gemma4T4Error(f"{self.source}: {INDEX_NAME} is not a valid index ({exc!r})",
                                fix="re-download the index file") from exc
        self.shards = sorted({safe_shard_name(v, self.source) for v in weight_map.values()})
        missing = [s for s in self.shards if not self._exists(s)]
        if missing:
            raise Gemma4T4Error(
                f"{self.source}: {len(missing)} shard(s) named in {INDEX_NAME} are missing: {', '.join(missing[:5])}",
                fix="download every shard listed in the index (an interrupted download leaves some out)",
            )
        for shard in self.shards:
            self.tensors.update(self._read_shard_header(shard))
        not_found = [n for n, s in weight_map.items() if n not in self.tensors or self.tensors[n].shard != s]
        unlisted = sorted(set(self.tensors) - set(weight_map))
        if not_found or unlisted:
            detail = []
            if not_found:
                detail.append(f"{len(not_found)} indexed tensor(s) not in their shard (e.g. {not_found[0]})")
            if unlisted:
                detail.append(f"{len(unlisted)} tensor(s) in shards but not in the index (e.g. {unlisted[0]})")
            raise Gemma4T4Error(f"{self.source}: index and shards disagree: {'; '.join(detail)}",
                                fix="the index belongs to another revision; re-download index and shards together")

    def _read(self, shard: str, start: int, length: int) -> bytes:
        view = memoryview(bytearray(length))
        self._read_into(shard, start, view)
        return bytes(view)

    def _read_shard_header(self, shard: str) -> dict[str, TensorInfo]:
        """The shard's tensor table from its validated header (``_read`` gives all bytes asked or raises)."""
        size = self._size(shard)
        # a single file given by its own path is named as given, a shard of a folder as folder/shard
        source = self.source if self.source.endswith("/" + shard) or self.source == shard else f"{self.source}/{shard}"
        (header_len,) = struct.unpack("<Q", self._read(shard, 0, 8))
        if header_len == 0 or header_len > MAX_HEADER_BYTES or (size is not None and 8 + header_len > size):
            raise Gemma4T4Error(
                f"{source} is not a safetensors file (header length {header_len})",
                fix="check the path; pickle checkpoints (.bin) are not supported, convert them to safetensors",
            )
        try:
            header = json.loads(self._read(shard, 8, header_len), object_pairs_hook=_unique_keys,
                                parse_constant=_no_constants)
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            reason = "nested too deeply" if isinstance(exc, RecursionError) else exc
            raise Gemma4T4Error(f"{source} has a corrupt safetensors header: {reason}", fix="re-download the file") from exc
        if not isinstance(header, dict):
            raise Gemma4T4Error(f"{source} has a corrupt safetensors header (not a JSON object)", fix="re-download the file")
        return tensors_from_header(header, 8 + header_len, shard, size)

    # -- reads ----------------------------------------------------------------------------
    def info(self, name: str) -> TensorInfo:
        try:
            return self.tensors[name]
        except KeyError:
            raise Gemma4T4Error(f"{self.source} has no tensor {name!r}",
                                fix="list the names with `gemma4-t4 grid-check CKPT --json`") from None

    def read_rows(self, name: str, row_start: int = 0, row_stop: int | None = None) -> np.ndarray:
        """Rows ``row_start:row_stop`` (first dimension) as a numpy array (BF16 as uint16 bits)."""
        info = self.info(name)
        shape = info.shape  # a scalar is read whole
        if shape:
            row_stop = shape[0] if row_stop is None else min(row_stop, shape[0])
            shape = (row_stop - row_start, *shape[1:])
        buf = np.empty(math.prod(shape) * DTYPES[info.dtype].itemsize, np.uint8)
        self._read_into(info.shard, info.start + row_start * info.row_bytes, memoryview(buf))
        return buf.view(DTYPES[info.dtype]).reshape(shape)

    def row_blocks(self, name: str, max_bytes: int, multiple: int = 1) -> Iterator[tuple[int, int]]:
        """Row ranges of at most ``max_bytes`` source bytes each, a ``multiple`` of rows (at least one
        multiple; the last range takes what is left)."""
        info = self.info(name)
        rows = info.shape[0] if info.shape else 1
        step = max(multiple, max_bytes // max(1, info.row_bytes) // multiple * multiple)
        for start in range(0, rows, step):
            yield start, min(rows, start + step)

    def close(self) -> None:
        pass

    def __enter__(self) -> CheckpointReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class LocalCheckpoint(CheckpointReader):
    """A directory with ``model.safetensors`` or an index + shards, or one ``.safetensors`` file."""

    def __init__(self, path: str | os.PathLike):
        super().__init__(str(path))
        self._fds: dict[str, int] = {}
        try:
            self._open(Path(path))
        except OSError as exc:
            self.close()
            if exc.errno == errno.ELOOP and exc.filename:  # a shard or index inside the folder loops
                raise missing_path_error(Path(exc.filename)) from exc
            raise Gemma4T4Error(f"cannot read {path}: {exc.strerror or exc}"
                                + (f" ({exc.filename})" if exc.filename else ""),
                                fix="check the path exists and is readable") from exc
        except ValueError as exc:  # e.g. a NUL byte in the path
            self.close()
            raise Gemma4T4Error(f"{path!r} is not a usable path ({exc})", fix="check the checkpoint path") from exc
        except BaseException:
            self.close()
            raise

    def _open(self, p: Path) -> None:
        refuse_pickle(str(p))
        if not p.exists():
            raise missing_path_error(p)
        if p.is_file():
            if p.name == INDEX_NAME:
                p = p.parent
            else:
                self.root = p.parent
                self._load_single(p.name)
                return
        self.root = p
        if not self._load_folder():
            singles = sorted(x.name for x in p.glob("*.safetensors"))
            pickles = sorted(x.name for x in p.iterdir() if x.name.lower().endswith(PICKLE_SUFFIXES))
            if len(singles) == 1:
                self._load_single(singles[0])
            elif pickles and not singles:
                refuse_pickle(str(p / pickles[0]))
            else:
                raise Gemma4T4Error(
                    f"{p} has no {SINGLE_NAME} or {INDEX_NAME}"
                    + (f" ({len(singles)} .safetensors files without an index)" if singles else ""),
                    fix="point at a Hugging Face checkpoint directory (config.json + safetensors)",
                )

    def _exists(self, shard: str) -> bool:
        path = self.root / shard
        if not path.is_file() and path.is_symlink():  # there, but a loop or dangling: say which
            raise missing_path_error(path)
        return path.is_file()

    def _size(self, shard: str) -> int | None:
        return (self.root / shard).stat().st_size

    def _read_into(self, shard: str, start: int, view: memoryview) -> None:
        fd = self._fds.get(shard)
        if fd is None:
            fd = self._fds[shard] = os.open(self.root / shard, os.O_RDONLY)
        # preadv may return short counts: loop
        done = 0
        while done < len(view):
            n = os.preadv(fd, [view[done:]], start + done)
            if n <= 0:
                raise Gemma4T4Error(f"{self.root / shard} ended at byte {start + done}, before the data its "
                                    "header describes", fix="the file is truncated; re-download it")
            done += n

    def read_text(self, name: str) -> str | None:
        p = self.root / name
        if not p.is_file():
            return None
        try:
            return p.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise Gemma4T4Error(f"cannot read {p}: {exc}", fix=f"restore a readable UTF-8 {name}") from exc

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


HEAD_BYTES = 256 * 1024  # one ranged GET per shard fetches the header (Gemma 4 shards: 10-90 KB)
HUB_HOSTS = ("huggingface.co", "hf.co")


def hub_headers(url: str, env: Mapping[str, str] = os.environ) -> dict[str, str]:
    """``Authorization`` for gated Hub repositories: HF_TOKEN, sent to Hugging Face hosts only."""
    token = env.get("HF_TOKEN") or env.get("HUGGING_FACE_HUB_TOKEN")
    host = urllib.parse.urlsplit(url).hostname or ""  # lower case, as urllib gives it
    if token and any(host == h or host.endswith("." + h) for h in HUB_HOSTS):
        return {"Authorization": f"Bearer {token}"}
    return {}


class RemoteCheckpoint(CheckpointReader):
    """A checkpoint over HTTP(S): ``url`` is the folder (``.../resolve/main``) or one file URL; one ranged
    GET per shard fetches its header (and file size), then one per block of rows."""

    def __init__(self, url: str, timeout: float = 60.0, headers: dict[str, str] | None = None):
        super().__init__(url)
        refuse_pickle(url)
        try:
            host = urllib.parse.urlsplit(url).hostname
        except ValueError:
            host = None
        if not host or any(c.isspace() or ord(c) < 32 for c in url):
            raise Gemma4T4Error(f"{url!r} is not a usable checkpoint URL",
                                fix="use a folder URL such as https://huggingface.co/ORG/NAME/resolve/main "
                                "(spaces must be written as %20)")
        self.timeout = timeout
        self.headers = hub_headers(url) if headers is None else dict(headers)
        self._heads: dict[str, tuple[bytes, int | None] | None] = {}  # shard -> (first bytes, file size)
        if url.endswith(".safetensors"):
            self.base, single = url.rsplit("/", 1)
            if not self._exists(single):
                raise Gemma4T4Error(f"{url} does not exist (HTTP 404)", fix="check the file URL")
            self._load_single(single)
            return
        self.base = url.rstrip("/")
        if not self._load_folder():
            raise Gemma4T4Error(f"{url} has neither {INDEX_NAME} nor {SINGLE_NAME}",
                                fix="use the checkpoint folder URL, e.g. https://huggingface.co/ORG/NAME/resolve/main")

    def _get(self, name: str, what: str, byte_range: tuple[int, int] | None = None,
             missing_ok: bool = False) -> tuple[bytes, str] | None:
        """The body of a GET of ``name`` (of ``byte_range``: a server that ignores it is refused before
        the body is read) and its Content-Range; None for no such file (HTTP 404) where ``missing_ok``
        (a shard or side file may be absent). A failure raises, naming ``what``."""
        try:
            req = urllib.request.Request(f"{self.base}/{name}", headers=self.headers)
            if byte_range is not None:
                req.add_header("Range", f"bytes={byte_range[0]}-{byte_range[1] - 1}")
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:  # noqa: S310 - user-chosen URL
                if byte_range is not None and resp.status != 206:
                    raise Gemma4T4Error(
                        f"{self.base}/{name} ignored the Range request (HTTP {resp.status})",
                        fix="use a server that supports HTTP range requests (the Hugging Face Hub does)",
                    )
                return resp.read(), resp.headers.get("Content-Range") or ""
        except urllib.error.HTTPError as exc:
            if exc.code == 404 and missing_ok:
                return None
            if exc.code not in (401, 403):
                fix = "check the URL"
            elif self.headers:
                fix = "the token was refused: check it can read this repository"
            else:
                fix = "the repository is gated or private: set HF_TOKEN to a token whose account accepted the model's licence"
            raise Gemma4T4Error(f"{what} failed: HTTP {exc.code}", fix=fix) from exc
        except urllib.error.URLError as exc:
            raise Gemma4T4Error(f"cannot reach {self.base}: {exc.reason}", fix="check the URL and network") from exc
        except (OSError, ValueError, http.client.HTTPException) as exc:  # timeouts, resets, malformed URLs
            raise Gemma4T4Error(f"{what} failed: {exc}", fix="check the URL and network") from exc

    def read_text(self, name: str) -> str | None:
        got = self._get(name, f"GET {self.base}/{name}", missing_ok=True)
        try:
            return got and got[0].decode()
        except UnicodeDecodeError as exc:
            raise Gemma4T4Error(f"{self.base}/{name} is not UTF-8 text", fix="check the URL") from exc

    def _head(self, shard: str) -> tuple[bytes, int | None] | None:
        """The first HEAD_BYTES of a shard (fewer for a smaller file) and its size from Content-Range
        (None if it does not exist), fetched once."""
        if shard not in self._heads:
            got = self._get(shard, f"range read of {self.base}/{shard}", (0, HEAD_BYTES), missing_ok=True)
            total = got[1].rpartition("/")[2] if got else ""
            self._heads[shard] = got and (got[0], int(total) if total.isdigit() else None)
        return self._heads[shard]

    def _exists(self, shard: str) -> bool:
        return self._head(shard) is not None

    def _size(self, shard: str) -> int | None:
        head = self._head(shard)
        return head[1] if head else None

    def _read_into(self, shard: str, start: int, view: memoryview) -> None:
        stop = start + len(view)
        head = self._head(shard)
        if head and stop <= len(head[0]):
            view[:] = head[0][start:stop]
            return
        data, _ = self._get(shard, f"range read of {self.base}/{shard}", (start, stop))
        if len(data) != len(view):
            raise Gemma4T4Error(f"{self.base}/{shard}: short read ({len(data)} of {len(view)} bytes)",
                                fix="retry; the file may have changed on the server")
        view[:] = data


def open_checkpoint(path: str | os.PathLike) -> CheckpointReader:
    """Open a local folder/file or an ``http(s)://`` checkpoint."""
    text = str(path)
    if text.startswith(("http://", "https://")):
        return RemoteCheckpoint(text)
    return LocalCheckpoint(path)


@dataclass
class PlannedTensor:
    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * DTYPES[self.dtype].itemsize


class ShardedWriter:
    """Write planned tensors into ``out_dir`` as one file or shards + index: the layout is fixed up front,
    every file created at its final size, and ``write_rows`` places bytes with ``pwrite``."""

    def __init__(self, out_dir: Path, plan: list[PlannedTensor], max_shard_bytes: int = 4 * 10**9):
        self.out_dir = Path(out_dir)
        groups: list[list[PlannedTensor]] = [[]]
        size = 0
        for t in plan:
            if groups[-1] and size + t.nbytes > max_shard_bytes:
                groups.append([])
                size = 0
            groups[-1].append(t)
            size += t.nbytes
        n = len(groups)
        self.files = [SINGLE_NAME] if n == 1 else [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
        self.tensors: dict[str, TensorInfo] = {}  # where each planned tensor's bytes go
        self._fds: dict[str, int] = {}
        try:
            for file, tensors in zip(self.files, groups, strict=True):
                header: dict = {"__metadata__": {"format": "pt"}}
                cursor = 0
                for t in tensors:
                    header[t.name] = {"dtype": t.dtype, "shape": list(t.shape), "data_offsets": [cursor, cursor + t.nbytes]}
                    cursor += t.nbytes
                raw = json.dumps(header, separators=(",", ":")).encode()
                raw += b" " * (-len(raw) % 8)  # data starts 8-byte aligned
                self.tensors.update(tensors_from_header(header, 8 + len(raw), file, None))
                fd = self._fds[file] = os.open(self.out_dir / file, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
                os.pwrite(fd, struct.pack("<Q", len(raw)) + raw, 0)
                os.ftruncate(fd, 8 + len(raw) + cursor)
        except BaseException:
            self.abort()
            raise

    def write_rows(self, name: str, row_start: int, array: np.ndarray) -> None:
        """Write ``array`` (rows ``row_start:...`` of tensor ``name``, already in its stored dtype)."""
        info = self.tensors[name]
        data = np.ascontiguousarray(array).view(np.uint8).reshape(-1)
        offset = info.start + row_start * info.row_bytes
        if offset + data.nbytes > info.end:
            raise ValueError(f"write past the end of {name}")
        view = memoryview(data)
        while view:
            written = os.pwrite(self._fds[info.shard], view, offset)
            view = view[written:]
            offset += written

    def finish(self) -> list[str]:
        """Flush, close and write the index (when sharded). Returns the files written."""
        for file in list(self._fds):
            os.fsync(self._fds[file])
            os.close(self._fds.pop(file))
        if len(self.files) == 1:
            return list(self.files)
        index = {
            "metadata": {"total_size": sum(t.nbytes for t in self.tensors.values())},
            "weight_map": {t.name: t.shard for t in self.tensors.values()},
        }
        (self.out_dir / INDEX_NAME).write_text(json.dumps(index, indent=2) + "\n")
        return [*self.files, INDEX_NAME]

    def abort(self) -> None:
        for fd in self._fds.values():
            try:
                os.close(fd)
            except OSError:
                pass  # already closed by a finish() that failed part way
        self._fds.clear()

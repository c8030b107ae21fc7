"""The source bundle ``build-image`` hands CodeBuild: a wheel of the installed package (its files,
distribution metadata and entry points: the ``vllm.general_plugins`` one loads the Turing fix) and the
image's Dockerfile, buildspec and build script, as a deterministic zip. Made from what is installed (a
wheel install or a checkout's editable one alike), so ``build-image`` needs no source tree.
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import zipfile
from collections.abc import Iterable, Iterator
from importlib import metadata
from pathlib import Path

from gemma4_t4.errors import Gemma4T4Error

# The image's Dockerfile, buildspec and local build script ship as package data; in the bundle they
# sit under docker/sagemaker-t4/, where the build's BUILDSPEC names them (a CodeBuild project created
# earlier keeps naming that path: an existing project is reused as is).
PACKAGE_DIR = Path(__file__).resolve().parents[1]
BUILD_DIR = PACKAGE_DIR / "data" / "sagemaker-t4"
BUNDLE_FOLDER = "docker/sagemaker-t4"
_DISTRIBUTION = "gemma4-t4"
_ZIP_TIME = (2020, 1, 1, 0, 0, 0)  # fixed timestamps: the same package gives the same bytes


def _package_files() -> Iterator[tuple[str, Path]]:
    """(path in the wheel, file) for every file of the installed package; compiled caches left out.
    os.walk follows links: a checkout links data/notebooks to its notebooks/ folder."""
    for folder, dirs, files in os.walk(PACKAGE_DIR, followlinks=True):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            path = Path(folder) / name
            if path.suffix not in (".pyc", ".pyo") and path.is_file():  # a dangling link is no file
                yield f"{PACKAGE_DIR.name}/{path.relative_to(PACKAGE_DIR).as_posix()}", path


def _zip(entries: Iterable[tuple[str, bytes, int]]) -> bytes:
    """A deterministic zip of (name, data, mode) entries, in the order given, every one at the same time."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data, mode in entries:
            info = zipfile.ZipInfo(name, date_time=_ZIP_TIME)
            info.external_attr = mode << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, data)
    return buffer.getvalue()


def package_wheel() -> tuple[str, bytes]:
    """(file name, bytes) of a wheel of the installed package, deterministic, built from what is
    installed: no pyproject.toml, no checkout."""
    try:
        dist = metadata.distribution(_DISTRIBUTION)
    except metadata.PackageNotFoundError:
        raise Gemma4T4Error(
            f"gemma4_t4 is imported from {PACKAGE_DIR} but no {_DISTRIBUTION} distribution is "
            "installed, so the image cannot carry its entry points (the Turing fix's vLLM plugin)",
            fix="install the package (pip install gemma4-t4, or pip install -e . in a checkout)") from None
    version = dist.version
    info_dir = f"gemma4_t4-{version}.dist-info"
    files = [(name, path.read_bytes()) for name, path in _package_files()]
    # an installed wheel has METADATA; a checkout's own egg-info (found first from its root) PKG-INFO
    about = dist.read_text("METADATA") or dist.read_text("PKG-INFO") or f"Metadata-Version: 2.1\nName: {_DISTRIBUTION}\n"
    files += [(f"{info_dir}/METADATA", about.encode()),
              (f"{info_dir}/entry_points.txt", (dist.read_text("entry_points.txt") or "").encode()),
              (f"{info_dir}/WHEEL", b"Wheel-Version: 1.0\nGenerator: gemma4_t4.sagemaker.build\n"
                                    b"Root-Is-Purelib: true\nTag: py3-none-any\n")]
    record = [f"{name},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},"
              f"{len(data)}" for name, data in files]
    files.append((f"{info_dir}/RECORD", "\n".join([*record, f"{info_dir}/RECORD,,", ""]).encode()))
    return f"gemma4_t4-{version}-py3-none-any.whl", _zip((name, data, 0o644) for name, data in files)


def source_bundle() -> bytes:
    """The build context CodeBuild gets: the package's wheel at the root, the Dockerfile, buildspec and
    build script under docker/sagemaker-t4/; a deterministic zip (fixed timestamps, sorted)."""
    if not (BUILD_DIR / "Dockerfile").is_file():
        raise Gemma4T4Error(f"the image build files are missing from the installed package ({BUILD_DIR})",
                            fix="reinstall the package (pip install --force-reinstall gemma4-t4)")
    wheel_name, wheel = package_wheel()
    build_files = [(f"{BUNDLE_FOLDER}/{path.name}", path.read_bytes(), 0o755 if path.suffix == ".sh" else 0o644)
                   for path in sorted(p for p in BUILD_DIR.iterdir() if p.is_file())]
    return _zip([*build_files, (wheel_name, wheel, 0o644)])


def write_build_context(folder: str | Path) -> Path:
    """The bundle unpacked into ``folder``: what build.sh hands to a local ``docker build``."""
    folder = Path(folder)
    with zipfile.ZipFile(io.BytesIO(source_bundle())) as archive:
        archive.extractall(folder)
        for info in archive.infolist():  # extractall drops the modes: build.sh stays executable
            (folder / info.filename).chmod((info.external_attr >> 16) & 0o777)
    return folder

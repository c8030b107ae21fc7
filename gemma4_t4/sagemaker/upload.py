"""Upload a local model folder (e.g. the output of ``repack --emb4``) to S3 as uncompressed model data.

The prefix is content-addressed (``models/<folder>-<manifest sha256[:12]>/``), so a second run uploads
nothing; each file's SHA-256 is object metadata, checked before skipping it, and S3 verifies every part
(``ChecksumAlgorithm=SHA256``). An interrupted multipart upload resumes on the next run (parts whose
size and MD5 ETag match the local bytes are kept).
"""

from __future__ import annotations

import base64
import hashlib
import os
import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.foundation.jsonable import JSONObject
from gemma4_t4.sagemaker.aws import aws_call, aws_error, aws_exceptions, client_factory, error_code
from gemma4_t4.sagemaker.cli_recipe import comment_line
from gemma4_t4.sagemaker.config import PROJECT_TAG, PROJECT_VALUE, PUBLIC_ACCESS_BLOCK, create_bucket_params
from gemma4_t4.sagemaker.image import validate_region

PART_SIZE = 64 * 1024 * 1024  # S3 allows 5 MiB..5 GiB per part and 10,000 parts
MIN_PART_SIZE = 5 * 1024 * 1024


@dataclass
class LocalFile:
    name: str  # relative path, POSIX
    path: Path
    size: int
    sha256: str


@dataclass
class UploadedFile:
    name: str
    size: int
    status: str  # uploaded | skipped (already there, same sha256) | resumed
    parts: int = 1


@dataclass
class UploadResult:
    s3_uri: str  # s3://bucket/prefix/ (what DeployConfig.model_data_s3_uri takes)
    bucket: str
    prefix: str
    files: list[UploadedFile] = field(default_factory=list)
    bytes_uploaded: int = 0
    total_bytes: int = 0

    def table(self) -> str:
        rows = [f"  {f.name:<48} {f.size / 2**20:10.1f} MiB  {f.status}" for f in self.files]
        return "\n".join([f"{self.s3_uri}  ({self.total_bytes / 2**30:.2f} GiB, "
                          f"{self.bytes_uploaded / 2**30:.2f} GiB uploaded now)", *rows])


def _sha256(path: Path) -> str:
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def scan_folder(folder: str | Path) -> list[LocalFile]:
    """The files to upload (dotfiles and partial outputs skipped); refuses a non-model folder."""
    root = Path(folder).expanduser()
    if not root.is_dir():
        raise Gemma4T4Error(f"model folder {root} does not exist or is not a folder",
                            fix="pass the folder holding config.json and the *.safetensors files")
    if not (root / "config.json").is_file():
        raise Gemma4T4Error(
            f"{root} has no config.json, so vLLM cannot serve it",
            fix="pass a Hugging Face-style model folder (e.g. the output of gemma4-t4 quant repack)")
    files, refused = [], []
    real_root = root.resolve()
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if any(part.startswith(".") for part in rel.parts):
            continue
        if path.is_symlink():
            # A link uploads the bytes it points to: outside the folder (rglob skips a linked folder)
            # or at a hidden file that is not the model; a broken one leaves a file out. Refused,
            # every one named, before any byte is sent.
            try:
                target = path.resolve(strict=True)
            except (OSError, RuntimeError) as exc:  # missing target, or a loop
                refused.append(f"{rel} -> {os.readlink(path)} (broken: {type(exc).__name__})")
                continue
            if not target.is_relative_to(real_root):
                refused.append(f"{rel} -> {target} (outside the folder)")
                continue
            if any(part.startswith(".") for part in target.relative_to(real_root).parts):
                refused.append(f"{rel} -> {target} (a hidden file, never uploaded)")
                continue
        if not path.is_file():
            continue
        files.append(LocalFile(rel.as_posix(), path, path.stat().st_size, _sha256(path)))
    if refused:
        raise Gemma4T4Error(
            f"{len(refused)} link(s) in {root} are broken or point outside the model or at hidden files: "
            + "; ".join(refused),
            fix="copy the real files into the folder (cp -L), or remove the links",
        )
    return files


def default_prefix(folder: str | Path, files: list[LocalFile]) -> str:
    """``models/<folder>-<manifest sha256[:12]>/``: the manifest lists every file's name, size and sha256."""
    name = "".join(c if c.isalnum() or c in "._-" else "-" for c in Path(folder).resolve().name)[:80]
    manifest = "".join(f"{f.name}\0{f.size}\0{f.sha256}\n" for f in files)
    return f"models/{name or 'model'}-{hashlib.sha256(manifest.encode()).hexdigest()[:12]}/"


def default_bucket(account: str, region: str) -> str:
    return f"gemma4-t4-models-{account}-{region}"


def upload_plan(folder: str | Path, bucket: str, region: str | None = None) -> tuple[str, list[str]]:
    """Dry run: the S3 URI and one ``aws s3 cp`` per file (shell-quoted); nothing is called."""
    files = scan_folder(folder)
    s3_uri = f"s3://{bucket}/{default_prefix(folder, files)}"
    region_arg = f" --region {shlex.quote(region)}" if region else ""
    commands = [
        f"# {comment_line(f'{f.name}: {f.size} bytes, sha256 {f.sha256}')}\n"
        f"aws s3 cp {shlex.quote(str(f.path))} {shlex.quote(s3_uri + f.name)} "
        f"--metadata {shlex.quote('sha256=' + f.sha256)} --checksum-algorithm SHA256{region_arg}"
        for f in files
    ]
    return s3_uri, commands


def ensure_bucket(s3: Any, bucket: str, region: str) -> None:
    """Create the (private, tagged) bucket if missing."""
    try:
        s3.create_bucket(**create_bucket_params(bucket, region))
    except aws_exceptions() as exc:
        if error_code(exc) == "BucketAlreadyOwnedByYou":
            return
        raise aws_error(exc, f"CreateBucket {bucket}") from exc
    s3.put_public_access_block(Bucket=bucket, PublicAccessBlockConfiguration=PUBLIC_ACCESS_BLOCK)
    s3.put_bucket_tagging(Bucket=bucket, Tagging={"TagSet": [{"Key": PROJECT_TAG, "Value": PROJECT_VALUE}]})


def remote_sha256(s3: Any, bucket: str, key: str, size: int) -> str | None:
    """The sha256 an object of ``size`` bytes was stored with (its metadata); None when it is not there."""
    try:
        head = s3.head_object(Bucket=bucket, Key=key)
    except aws_exceptions() as exc:
        if error_code(exc) in ("404", "NoSuchKey", "NotFound"):
            return None
        raise
    if head.get("ContentLength") != size:
        return None
    return head.get("Metadata", {}).get("sha256")


def _b64(digest: bytes) -> str:
    return base64.b64encode(digest).decode()


def _multipart(s3: Any, bucket: str, key: str, f: LocalFile, part_size: int,
               advance: Callable[[int], None]) -> tuple[str, int, int]:
    """Upload ``f`` in parts, resuming an unfinished upload of ``key``. Returns (status, parts, bytes sent)."""
    upload_id, done = None, {}
    for upload in s3.list_multipart_uploads(Bucket=bucket, Prefix=key).get("Uploads", []):
        if upload.get("Key") == key:
            upload_id = upload["UploadId"]
            for part in s3.list_parts(Bucket=bucket, Key=key, UploadId=upload_id).get("Parts", []):
                done[part["PartNumber"]] = (part.get("Size"), part.get("ETag", "").strip('"'))
            break
    status = "resumed" if upload_id else "uploaded"
    upload_id = upload_id or s3.create_multipart_upload(Bucket=bucket, Key=key, Metadata={"sha256": f.sha256},
                                                        ChecksumAlgorithm="SHA256")["UploadId"]
    completed: list[JSONObject] = []  # CompleteMultipartUpload's parts
    sent = 0  # bytes of the parts sent now (parts kept from an earlier run are not)
    try:
        with f.path.open("rb") as handle:  # one part in memory at a time
            for number, chunk in enumerate(iter(lambda: handle.read(part_size), b""), start=1):
                md5 = hashlib.md5(chunk, usedforsecurity=False).hexdigest()
                sha = _b64(hashlib.sha256(chunk).digest())
                if done.get(number) == (len(chunk), md5):
                    etag = md5
                else:
                    etag = s3.upload_part(Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=number,
                                          Body=chunk, ChecksumSHA256=sha)["ETag"].strip('"')
                    sent += len(chunk)
                completed.append({"PartNumber": number, "ETag": etag, "ChecksumSHA256": sha})
                advance(len(chunk))
    except BaseException as exc:  # Ctrl-C, SIGTERM/SIGHUP (signals.orderly_stop) or a failure mid-file
        # what it leaves, and the two ways out: resume, or abort (no parts billed)
        why = "interrupted" if isinstance(exc, KeyboardInterrupt) else f"failed ({type(exc).__name__})"
        print(f"upload of s3://{bucket}/{key} {why} after {len(completed)} part(s); the parts stay in S3 (billed as "
              "storage) so that re-running the same command resumes from them. To drop them instead: "
              f"aws s3api abort-multipart-upload --bucket {shlex.quote(bucket)} --key {shlex.quote(key)} "
              f"--upload-id {shlex.quote(upload_id)}", file=sys.stderr)
        raise
    s3.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id,
                                 MultipartUpload={"Parts": completed})
    return status, len(completed), sent


def upload_model_folder(folder: str | Path, region: str, *, bucket: str | None = None, s3_client: Any = None,
                        part_size: int = PART_SIZE, progress: bool = True) -> UploadResult:
    """Upload ``folder`` to ``s3://bucket/prefix/``; files already there (same sha256) are skipped."""
    from tqdm.auto import tqdm

    validate_region(region)
    if part_size < MIN_PART_SIZE:
        raise Gemma4T4Error(f"part size {part_size} is below S3's 5 MiB minimum",
                            fix="use the default (64 MiB)")
    files = scan_folder(folder)
    make = client_factory()
    s3 = s3_client or make("s3", region)
    with aws_call(f"upload of {folder} to S3"):
        if bucket is None:
            bucket = default_bucket(make("sts", region).get_caller_identity()["Account"], region)
        prefix = default_prefix(folder, files)
        ensure_bucket(s3, bucket, region)
        total = sum(f.size for f in files)
        result = UploadResult(f"s3://{bucket}/{prefix}", bucket, prefix, total_bytes=total)
        with tqdm(total=total, unit="B", unit_scale=True, desc="upload", disable=not progress) as bar:
            for f in files:
                key = prefix + f.name
                if remote_sha256(s3, bucket, key, f.size) == f.sha256:
                    result.files.append(UploadedFile(f.name, f.size, "skipped"))
                    bar.update(f.size)
                    continue
                if f.size > part_size:
                    status, parts, sent = _multipart(s3, bucket, key, f, part_size, bar.update)
                else:
                    body = f.path.read_bytes()
                    s3.put_object(Bucket=bucket, Key=key, Body=body, Metadata={"sha256": f.sha256},
                                  ChecksumSHA256=_b64(hashlib.sha256(body).digest()))
                    status, parts, sent = "uploaded", 1, f.size
                    bar.update(f.size)
                result.files.append(UploadedFile(f.name, f.size, status, parts))
                result.bytes_uploaded += sent
    return result

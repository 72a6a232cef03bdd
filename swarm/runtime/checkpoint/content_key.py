"""The SHA-256 of each checkpoint file, for the store's key, computed once per file version.

Hashing a checkpoint reads all of it (about a second per GB, see the README), so each file's
digest is remembered in a small record under the cache folder, named by what identifies this
version of the file on this machine: device, inode, size, modification and change time. The
change time cannot be set back by a user, so a file edited in place and re-stamped with its old
modification time gets a new record (and is hashed again). The path is not in the record's
name: a moved file is hashed again only where the move changed its inode or change time, and a
copy is hashed once, then finds the store its content already has."""

from __future__ import annotations

import hashlib
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

from swarm.errors import ModelError

log = logging.getLogger(__name__)

DIGESTS_DIR = ".content-digests"  # under the cache folder, beside the stores
_NOTICEABLE_BYTES = 1_000_000_000  # a file this big takes about a second: say why we wait


@dataclass(frozen=True)
class FileDigest:
    path: Path
    sha256: str
    record: Path  # where the digest is (or is to be) remembered
    fresh: bool  # computed now, not read from its record


def file_digests(files: list[Path], cache_dir: Path) -> list[FileDigest]:
    """Each file's SHA-256, from its record when this version of the file has one. Writes
    nothing: `remember` keeps the fresh ones once the caller has used them."""
    return [_digest(f, cache_dir.expanduser() / DIGESTS_DIR) for f in files]


def remember(digests: list[FileDigest]) -> None:
    """Write the records of freshly computed digests. A record that cannot be written only
    costs a rehash at the next start, so failure is not an error."""
    for digest in digests:
        if not digest.fresh:
            continue
        try:
            digest.record.parent.mkdir(parents=True, exist_ok=True)
            tmp = digest.record.with_name(f".{digest.record.name}.tmp-{os.getpid()}")
            tmp.write_text(digest.sha256)
            tmp.rename(digest.record)
        except OSError:
            continue


def _digest(path: Path, records: Path) -> FileDigest:
    try:
        before = path.stat()
    except OSError as e:
        raise ModelError(f"cannot read {path}: {e.strerror}") from None
    record = records / _version(before)
    try:
        known = record.read_text().strip()
    except OSError:
        known = ""
    if len(known) == 64:
        return FileDigest(path, known, record, fresh=False)
    started = time.monotonic()
    try:
        sha256 = _sha256(path)
        after = path.stat()
    except OSError as e:
        raise ModelError(f"cannot read {path}: {e.strerror}") from None
    if _version(after) != record.name:
        raise ModelError(f"{path} changed while it was hashed; start again once it is written")
    log.log(
        logging.INFO if before.st_size >= _NOTICEABLE_BYTES else logging.DEBUG,
        "hashed %s (%.0f MB) in %.1f s, once for this version of the file",
        path.name,
        before.st_size / 1e6,
        time.monotonic() - started,
    )
    return FileDigest(path, sha256, record, fresh=True)


def _sha256(path: Path) -> str:
    with path.open("rb") as f:  # streamed in blocks, never the whole file in memory
        return hashlib.file_digest(f, "sha256").hexdigest()


def _version(stat: os.stat_result) -> str:
    return f"{stat.st_dev}-{stat.st_ino}-{stat.st_size}-{stat.st_mtime_ns}-{stat.st_ctime_ns}"

"""Files of one repository on a Hugging Face hub, read over HTTP with huggingface_hub: the
repository's file list at one commit, each file's size and hash (the HEAD of its `resolve`
URL), byte ranges of it, and whole files.

Whole files download resumably (a `.partial` file grows until complete; a later run asks for
the rest with a Range header) and are checked against the hash the hub gives: the sha256 of an
LFS file (X-Linked-Etag), git's blob hash of any other. Byte ranges land at their offset in a
sparse copy of the file, in pieces recorded as they complete, so a cut-off download resumes by
piece. The hub gives no hash of a range: ranges are not verified (only their length is).

Every call blocks: callers run them in a worker thread. Every failure becomes one swarm error
naming the cause: ModelNotFoundError (no such repository, revision or file), TransferError (the
hub cannot be reached or refused, or a file fails its hash)."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import httpx2
from huggingface_hub import (
    HfApi,
    constants,
    get_hf_file_metadata,
    get_session,
    hf_hub_url,
    hf_raise_for_status,
)
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    OfflineModeIsEnabled,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.utils._headers import build_hf_headers

from swarm.errors import CacheWriteError, ModelNotFoundError, TransferError
from swarm.runtime.checkpoint.source import HubRef

# huggingface_hub's client logs every request at INFO: a node's log would be mostly that
logging.getLogger("httpx2").setLevel(logging.WARNING)

PIECE_BYTES = 16 * 1024 * 1024  # a range is fetched and recorded in pieces of this size
_READ_BYTES = 1024 * 1024  # bytes handed from the socket to the file at a time
Progress = Callable[[int], None]  # told each number of bytes written


@dataclass(frozen=True)
class RemoteFile:
    name: str
    size: int
    etag: str  # sha256 of an LFS file, git's blob sha1 of any other (normalised, no quotes)


class HubRepo:
    """One repository pinned to the commit its revision named when it was opened, so every
    file comes from the same snapshot."""

    def __init__(
        self, ref: HubRef, commit: str, files: list[str], endpoint: str, timeout_s: float
    ) -> None:
        self.ref = ref
        self.endpoint = endpoint
        self.commit = commit
        self.files = files
        self._timeout_s = timeout_s
        self._remote: dict[str, RemoteFile] = {}

    @classmethod
    def open(cls, ref: HubRef, timeout_s: float) -> HubRepo:
        endpoint = constants.ENDPOINT  # HF_ENDPOINT, as huggingface_hub read it
        with hub_errors(ref):
            api = HfApi(endpoint=endpoint)
            info = api.model_info(ref.repo_id, revision=ref.revision, timeout=timeout_s)
        if not info.sha:
            raise TransferError(f"{ref}: the hub at {constants.ENDPOINT} named no commit")
        files = sorted(s.rfilename for s in info.siblings or [])
        return cls(ref, info.sha, files, endpoint, timeout_s)

    def remote(self, name: str) -> RemoteFile:
        """Size and hash of one file (asked once)."""
        if name not in self._remote:
            with hub_errors(self.ref, name):
                meta = get_hf_file_metadata(
                    self._url(name), timeout=self._timeout_s, endpoint=self.endpoint
                )
            if meta.size is None or not meta.etag:
                raise TransferError(f"{self.ref}: the hub sent no size or hash for {name}")
            self._remote[name] = RemoteFile(name, meta.size, meta.etag)
        return self._remote[name]

    def read(self, name: str, start: int, end: int) -> bytes:
        """Bytes [start, end) of a file."""
        parts: list[bytes] = []
        self._get(name, start, end, parts.append)
        data = b"".join(parts)
        if len(data) != end - start:
            raise TransferError(f"{self.ref}: {name} bytes {start}-{end} came back short")
        return data

    def download(self, name: str, dest: Path, progress: Progress) -> None:
        """The whole file at `dest`, checked against its hash; resumes a `.partial` left by an
        earlier try."""
        remote = self.remote(name)
        partial = dest.with_name(dest.name + ".partial")
        with cache_errors(dest), partial.open("ab") as f:
            fcntl.flock(f, fcntl.LOCK_EX)  # another node on this cache may be downloading it
            if dest.is_file():
                return  # it finished while this one waited
            have = f.tell()
            if have > remote.size:
                f.truncate(0)
                have = 0
            progress(have)
            if have < remote.size:
                self._get(name, have, remote.size, _writer(f, progress))
            f.flush()
            if f.tell() != remote.size:
                raise TransferError(f"{self.ref}: {name} came back short; the next try resumes")
            if not matches(partial, remote.etag):
                partial.unlink()  # a TransferError: a move tries it again at the next re-plan
                raise TransferError(
                    f"{self.ref}: {name} does not match the hash the hub gives for it"
                )
            partial.rename(dest)

    def fetch_ranges(
        self, name: str, sparse: Path, ranges: list[tuple[int, int]], progress: Progress
    ) -> None:
        """Write bytes [start, end) of each of `ranges` into `sparse` (a copy of the file of
        its full size) at their offsets, skipping pieces an earlier call recorded."""
        book = sparse.with_name(sparse.name + ".ranges.json")
        with cache_errors(sparse):
            done = _recorded(book)
            for start, end in ranges:
                for piece in _pieces(start, end):
                    if piece in done:  # landed in an earlier try
                        progress(piece[1] - piece[0])
                        continue
                    with sparse.open("r+b") as f:
                        f.seek(piece[0])
                        self._get(name, piece[0], piece[1], _writer(f, progress))
                        if f.tell() != piece[1]:
                            raise TransferError(f"{self.ref}: {name} piece {piece} came back short")
                    done.add(piece)
                    _record(book, done)

    def _url(self, name: str) -> str:
        return hf_hub_url(self.ref.repo_id, name, revision=self.commit, endpoint=self.endpoint)

    def _get(self, name: str, start: int, end: int, sink: Callable[[bytes], object]) -> None:
        headers = {**build_hf_headers(), "Range": f"bytes={start}-{end - 1}"}
        with (
            hub_errors(self.ref, name),
            get_session().stream(
                "GET", self._url(name), headers=headers, timeout=self._timeout_s
            ) as r,
        ):
            hf_raise_for_status(r)
            # a 200 is the whole file: right only when the whole file was asked for
            whole = r.status_code == 200 and r.headers.get("Content-Length") == str(end)
            if r.status_code != 206 and not (start == 0 and whole):
                raise TransferError(
                    f"{self.ref}: the hub ignored a byte range of {name} ({r.status_code})"
                )
            for data in r.iter_bytes(_READ_BYTES):
                sink(data)


def matches(path: Path, etag: str) -> bool:
    """Whether a file hashes to the hub's etag: sha256 (LFS) or git's blob sha1."""
    if len(etag) == 64:
        h = hashlib.sha256()
    elif len(etag) == 40:
        h = hashlib.sha1(usedforsecurity=False)
        h.update(f"blob {path.stat().st_size}\0".encode())
    else:
        return True  # a hash of another kind: nothing to check against
    with path.open("rb") as f:
        while data := f.read(_READ_BYTES):
            h.update(data)
    return h.hexdigest() == etag


@contextlib.contextmanager
def hub_errors(ref: HubRef, name: str | None = None) -> Iterator[None]:
    """huggingface_hub's and the network's exceptions as one swarm error each."""
    where = constants.ENDPOINT
    try:
        yield
    except GatedRepoError:
        raise ModelNotFoundError(
            f"{ref.repo_id}: a gated repository on {where}; accept its terms and set HF_TOKEN"
        ) from None
    except RepositoryNotFoundError:
        raise ModelNotFoundError(
            f"{ref.repo_id}: no such repository on {where} (nor a local file or folder)"
        ) from None
    except RevisionNotFoundError:
        raise ModelNotFoundError(
            f"{ref.repo_id}: no revision {ref.revision!r} on {where}"
        ) from None
    except RemoteEntryNotFoundError:
        raise ModelNotFoundError(f"{ref.repo_id}: no file {name!r} on {where}") from None
    except OfflineModeIsEnabled:
        raise TransferError(f"{ref}: HF_HUB_OFFLINE is set, the hub cannot be asked") from None
    except HfHubHTTPError as e:
        status = "" if e.response is None else f"{e.response.status_code} "
        raise TransferError(f"{ref}: the hub at {where} answered {status}for {name}") from None
    except httpx2.HTTPError as e:  # refused, unreachable, timed out, cut off
        raise TransferError(
            f"{ref}: cannot reach the hub at {where}: {e or type(e).__name__}"
        ) from None


@contextlib.contextmanager
def cache_errors(path: Path) -> Iterator[None]:
    try:
        yield
    except OSError as e:
        raise CacheWriteError(f"cannot write {path}: {e}") from None


def _writer(f: BinaryIO, progress: Progress) -> Callable[[bytes], None]:
    def write(data: bytes) -> None:
        f.write(data)
        progress(len(data))

    return write


def _pieces(start: int, end: int) -> Iterator[tuple[int, int]]:
    for at in range(start, end, PIECE_BYTES):
        yield at, min(at + PIECE_BYTES, end)


def _recorded(book: Path) -> set[tuple[int, int]]:
    try:
        return {(int(a), int(b)) for a, b in json.loads(book.read_text())}
    except (OSError, ValueError, TypeError):
        return set()


def _record(book: Path, done: set[tuple[int, int]]) -> None:
    # a name of this writer's own: two parts of one file may be fetched at once
    tmp = book.with_name(f".{book.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    tmp.write_text(json.dumps(sorted(done)))
    os.replace(tmp, book)

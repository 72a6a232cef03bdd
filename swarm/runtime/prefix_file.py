"""Kept prompt blocks on disk: what a node writes to its state folder as it stops and reads
back when it serves the same layers again, so the first prompts after a restart start from
them (`swarm.runtime.prefix_blocks`).

A file holds the blocks of one shard's span: a header naming everything their bits depend
on beside their digests (model, span, dtype, the cache's shape, the file format, swarm's
version), the blocks' tensors, and a BLAKE2b digest of all of it. A file made otherwise is
refused by name; a torn or corrupt one is refused as such. The caller deletes either and
starts without it."""

from __future__ import annotations

import hashlib
import json
import os
import struct
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from swarm.runtime.prefix_blocks import BlockKey, PrefixBlock
from swarm.types import LayerSpan

FORMAT = 1
_MAGIC = b"SWPBLKS\n"
_LENGTH = struct.Struct("<Q")
_CHECK_BYTES = 32


class PrefixFileError(Exception):
    """A file of kept blocks that is not read: made otherwise, torn or corrupt."""


@dataclass(frozen=True)
class BlocksIdentity:
    """What the bits of a shard's kept blocks depend on beside their digests."""

    model_id: str
    span: tuple[int, int]
    dtype: str
    kv_heads: int
    head_dim: int
    swarm_version: str
    format: int = FORMAT

    def file_name(self) -> str:
        return f"prompt-blocks-{self.span[0]}-{self.span[1]}.bin"


def save(
    path: Path,
    identity: BlocksIdentity,
    blocks: Sequence[tuple[BlockKey, PrefixBlock]],
    limit_bytes: int,
) -> int:
    """Write `blocks` (the most recently used first, which a limit keeps) up to
    `limit_bytes` of tensors; the number written. Written whole or not at all (a temporary
    file renamed over `path`); OSError (a full disk) leaves no file behind."""
    kept: list[tuple[BlockKey, PrefixBlock]] = []
    total = 0
    for key, block in blocks:
        if total + block.nbytes > limit_bytes:
            break
        kept.append((key, block))
        total += block.nbytes
    header = {
        "identity": asdict(identity),
        "blocks": [
            {"digest": digest, "layers": [layers.start, layers.end], "tokens": block.tokens}
            for (digest, layers), block in kept
        ],
    }
    head = json.dumps(header).encode()
    check = hashlib.blake2b(digest_size=_CHECK_BYTES)
    temporary = path.with_name(path.name + ".partial")
    try:
        with temporary.open("wb") as f:
            for part in (_MAGIC, _LENGTH.pack(len(head)), head):
                f.write(part)
                check.update(part)
            for _, block in kept:
                for tensor in (*block.keys, *block.values):
                    # any dtype, from any device (a GPU group's layers keep theirs there)
                    data = tensor.cpu().contiguous().view(torch.uint8).numpy().tobytes()
                    f.write(data)
                    check.update(data)
            f.write(check.digest())
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, path)
    except OSError:
        temporary.unlink(missing_ok=True)
        raise
    return len(kept)


def load(
    path: Path, identity: BlocksIdentity, dtype: torch.dtype
) -> list[tuple[BlockKey, PrefixBlock]]:
    """The blocks `path` holds, in the order written; PrefixFileError where it was made
    for something else than `identity`, or is torn or corrupt."""
    data = path.read_bytes()
    if len(data) < len(_MAGIC) + _LENGTH.size + _CHECK_BYTES or not data.startswith(_MAGIC):
        raise PrefixFileError("not a file of kept prompt blocks, or torn")
    body, check = data[:-_CHECK_BYTES], data[-_CHECK_BYTES:]
    if hashlib.blake2b(body, digest_size=_CHECK_BYTES).digest() != check:
        raise PrefixFileError("torn or corrupt (its digest does not match)")
    (head_length,) = _LENGTH.unpack_from(body, len(_MAGIC))
    start = len(_MAGIC) + _LENGTH.size
    try:
        header = json.loads(body[start : start + head_length])
        found = BlocksIdentity(**{**header["identity"], "span": tuple(header["identity"]["span"])})
    except (ValueError, TypeError, KeyError) as e:
        raise PrefixFileError(f"its header does not read ({e})") from None
    if found != identity:
        differ = [k for k, v in asdict(identity).items() if asdict(found)[k] != v]
        raise PrefixFileError(f"made for another {', '.join(differ)}: {found}")
    at = start + head_length
    element = torch.empty((), dtype=dtype).element_size()
    blocks: list[tuple[BlockKey, PrefixBlock]] = []
    for entry in header["blocks"]:
        layers = LayerSpan(*entry["layers"])
        shape = (1, identity.kv_heads, int(entry["tokens"]), identity.head_dim)
        size = element * shape[1] * shape[2] * shape[3]
        tensors = []
        for _ in range(2 * len(layers)):
            if at + size > len(body):
                raise PrefixFileError("shorter than its header says")
            raw = bytearray(body[at : at + size])  # writable: the tensor owns a copy
            tensors.append(torch.frombuffer(raw, dtype=torch.uint8).view(dtype).reshape(shape))
            at += size
        half = len(layers)
        block = PrefixBlock(tuple(tensors[:half]), tuple(tensors[half:]))
        blocks.append(((str(entry["digest"]), layers), block))
    return blocks

"""A SentencePiece-style vocabulary's ranked pairs (`score_ranked_pairs`), kept beside its
fields in the model cache: deriving them is most of such a tokenizer's load (1.8 s of CPU
of Gemma 3's 262k-entry vocabulary's 3.1 s), reading them back takes milliseconds.

The file is named by the algorithm's version and a digest of the fields it was derived from,
so a changed vocabulary or derivation is never read; its name starts with a dot, so it stays
out of the index peers receive (they derive their own). A cache that cannot be written costs
the derivation at each start, nothing else."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
from pathlib import Path

import numpy as np

from swarm.runtime.checkpoint.gguf_metadata import VOCAB_FILE
from swarm.runtime.text.gguf_tokenizer import score_ranked_pairs
from swarm.runtime.text.gguf_vocab import GGUFVocab

log = logging.getLogger(__name__)

_VERSION = 1  # of score_ranked_pairs' order: raise it when the derivation changes


def cached_ranked_pairs(folder: Path, vocab: GGUFVocab) -> np.ndarray:
    """The vocabulary's ranked pairs, from `folder` when an earlier start kept them."""
    digest = hashlib.sha256((folder / VOCAB_FILE).read_bytes()).hexdigest()[:20]
    path = folder / f".spm-pairs-v{_VERSION}-{digest}.npy"
    try:
        kept: np.ndarray = np.load(path, allow_pickle=False)
        if _well_formed(kept, vocab.n_tokens):
            return kept
        log.warning("%s: not a table of ranked pairs; deriving them again", path)
    except FileNotFoundError:
        pass
    except (OSError, ValueError) as e:
        log.warning("%s: unreadable (%s); deriving the ranked pairs again", path, e)
    pairs = score_ranked_pairs(vocab)
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    try:
        with partial.open("wb") as f:
            np.save(f, pairs, allow_pickle=False)
        partial.replace(path)  # whole or absent: a reader never sees half a table
    except OSError as e:
        with contextlib.suppress(OSError):
            partial.unlink()
        log.info(
            "cannot keep the ranked pairs in %s (%s); they are derived at each start", folder, e
        )
    return pairs


def _well_formed(pairs: np.ndarray, n_tokens: int) -> bool:
    if pairs.dtype != np.int32 or pairs.ndim != 2 or pairs.shape[1] != 2:
        return False
    return pairs.size == 0 or (int(pairs.min()) >= 0 and int(pairs.max()) < n_tokens)

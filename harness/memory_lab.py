"""What a node's memory holds, on the 7B-shaped fixture (`bench.fixture_7b`, 4.7 GB).

Three real node processes, each capped to 40% of the file's decoder-layer bytes
(`runtime.layer_memory_bytes`), serve the model; a greedy answer must equal one process's.
Then per node: its span, the span's packed bytes, the embedding and head bytes, the process's
anonymous resident memory (RssAnon, /proc/<pid>/status) and the ratio of RssAnon to span +
embedding/head + the fixed overhead. The fixed overhead is measured, not assumed: a fourth node
started with room for no layer holds everything a node holds besides its span (interpreter,
torch, store index, tokenizer, embedding and head, server and gossip); its RssAnon less the
embedding and head bytes. A process holding only the entry pieces is profiled too (RssAnon after
each step). Then that empty node restarts with room for a quarter of the layer bytes, the
others' spans move, and the table is printed again once the moves have settled and the old
shards are released.

    python -m bench.memory [--tokens 8] [--no-join]
    python -m bench.memory --profile 0:9   (one process, RssAnon after each loading step)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from harness.fixture_7b import DEFAULT_CACHE, fixture_path
from harness.polling import DidNotHappen, until
from swarm.config import RuntimeConfig
from swarm.demo import wait_for_coverage
from swarm.runtime.checkpoint.manifest import MANIFEST_FILE
from swarm.runtime.checkpoint.store import ModelStore

PROMPT = "Explain how a rainbow forms."
LAYER_SHARE = 0.4  # of the model's decoder bytes, per node
JOIN_SHARE = 0.25  # the node that joins later
BOUND = 1.15  # RssAnon <= BOUND * span bytes + embedding/head + fixed overhead
SETTLE_S = 300.0  # for spans to stop moving after a join, on a loaded machine
JOIN_S = 900.0  # for a node to start, probe its speed, load the entry pieces and announce
RELEASE_S = 180.0  # after that, for moved nodes to release their old shards
MIB = 1 << 20


def rss_anon(pid: int) -> int:
    """Anonymous resident bytes of a process (heap, torch's tensors, Python objects)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no RssAnon for {pid}")


def rollup(pid: int) -> dict[str, int]:
    """/proc/<pid>/smaps_rollup in bytes (Rss, Anonymous, Private_Dirty, ...)."""
    out = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        key, _, rest = line.partition(":")
        parts = rest.split()
        if len(parts) == 2 and parts[1] == "kB":
            out[key] = int(parts[0]) * 1024
    return out


def runtime_for(cache: Path) -> RuntimeConfig:
    return RuntimeConfig(model=str(fixture_path()), cache_dir=cache, dtype="packed", threads=1)


def layer_bytes(store: ModelStore, start: int, end: int) -> int:
    return sum(store.part_bytes(f"layer-{i:04d}") for i in range(start, end))


def entry_bytes(store: ModelStore) -> int:
    return store.part_bytes("embed") + store.part_bytes("head")


def child(mode: str, cache: Path, arg: str) -> dict[str, Any]:
    """Run this module in a fresh interpreter (its memory is all its own); its JSON line."""
    out = subprocess.run(
        [sys.executable, "-m", "harness.memory_lab", f"--{mode}", arg, "--cache", str(cache)],
        capture_output=True,
        text=True,
        check=True,
        timeout=1800,
    )
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def index_copy(store: ModelStore, cache: Path) -> Path:
    """A cache holding `store`'s index only (config, tokenizer, manifest), as a node's own
    cache starts: every part is then cut from the file by the node that needs it."""
    folder = cache / store.folder.name
    shutil.copytree(store.folder / "tokenizer", folder / "tokenizer")
    for name in ("config.json", MANIFEST_FILE):
        shutil.copy(store.folder / name, folder / name)
    return cache


def profile(cache: Path, span: str) -> dict[str, Any]:
    """RssAnon after each step a node takes to serve `span` ("start:end", or "" for the
    entry pieces only), in this process; parts not in `cache` are cut from the file."""
    import os

    steps: list[tuple[str, int]] = [("interpreter", rss_anon(os.getpid()))]
    import torch

    from swarm.runtime.execution.entry import EntryModel
    from swarm.runtime.execution.model import ModelContext
    from swarm.runtime.execution.shard import Shard
    from swarm.runtime.text.tokenizer import load_tokenizer
    from swarm.types import LayerSpan, SessionId

    pid = os.getpid()
    steps.append(("imports (torch, swarm)", rss_anon(pid)))
    runtime = runtime_for(cache)
    context = ModelContext.open(runtime, progress=False)
    steps.append(("model context (store index)", rss_anon(pid)))
    tokenizer = load_tokenizer(context.store.tokenizer_folder, "fixture")
    steps.append(("tokenizer alone", rss_anon(pid)))
    del tokenizer
    entry = EntryModel(context)
    steps.append(("entry (tokenizer, embedding, head)", rss_anon(pid)))
    ids = entry.encode_chat([{"role": "user", "content": PROMPT}])
    hidden = entry.embed(ids)
    entry.logits(hidden)
    steps.append(("after embedding + head product", rss_anon(pid)))
    if span:
        start, end = (int(x) for x in span.split(":"))
        shard = Shard.load(context, LayerSpan(start, end), runtime)
        steps.append((f"shard {start}:{end} loaded", rss_anon(pid)))
        with torch.inference_mode():
            out = shard.forward(SessionId("s"), hidden, 0)
            for i in range(4):
                out = shard.forward(SessionId("s"), out[:, -1:], len(ids) + i)
        steps.append(("after prefill + 4 decode steps", rss_anon(pid)))
        shard.close_session(SessionId("s"))
    store = context.store
    return {
        "steps": steps,
        "rollup": rollup(pid),
        "entry_bytes": entry_bytes(store),
        "span_bytes": layer_bytes(store, *(int(x) for x in span.split(":"))) if span else 0,
    }


def reference(cache: Path, tokens: str) -> dict[str, Any]:
    """One process's greedy text (this also stores every part in `cache`)."""
    from harness.reference import generate_locally

    [generated] = asyncio.run(generate_locally(runtime_for(cache), [PROMPT], int(tokens)))
    return {"text": generated.text, "tokens": generated.token_ids}


def rows_of(
    status: dict[str, Any], pids: dict[str, int], store: ModelStore, fixed: int
) -> list[dict[str, Any]]:
    rows = []
    for member in status["members"]:
        address, span = member["address"], member["span"]
        if address not in pids or not span:
            continue
        span_bytes = layer_bytes(store, *span)
        anon = rss_anon(pids[address])
        base = span_bytes + entry_bytes(store) + fixed
        rows.append(
            {
                "address": address,
                "span": span,
                "span_bytes": span_bytes,
                "entry_bytes": entry_bytes(store),
                "rss_anon": anon,
                "ratio": anon / base,
                "bound": int(BOUND * span_bytes + entry_bytes(store) + fixed),
            }
        )
    return rows


def print_rows(title: str, rows: list[dict[str, Any]], fixed: int) -> None:
    print(f"\n{title} (fixed overhead {fixed / MIB:.0f} MiB)")
    print("node             span     layers MiB  embed+head MiB  RssAnon MiB  ratio  bound MiB")
    for r in rows:
        print(
            f"{r['address']:<16} {r['span'][0]:>2}:{r['span'][1]:<4} {r['span_bytes'] / MIB:>10.0f}"
            f"  {r['entry_bytes'] / MIB:>14.0f}  {r['rss_anon'] / MIB:>11.0f}  {r['ratio']:>5.2f}"
            f"  {r['bound'] / MIB:>9.0f}{'' if r['rss_anon'] <= r['bound'] else '  OVER'}"
        )


async def status_of(http: aiohttp.ClientSession, address: str) -> dict[str, Any]:
    async with http.get(f"http://{address}/status") as r:
        result: dict[str, Any] = await r.json()
    return result


async def settled(http: aiohttp.ClientSession, address: str, members: int) -> dict[str, Any]:
    """The status once `members` serve and no span changed for 20 s (or SETTLE_S passed)."""
    status: dict[str, Any] = {}
    last, since = None, time.monotonic()

    async def quiet() -> bool:
        nonlocal status, last, since
        status = await status_of(http, address)
        spans = sorted((m["address"], tuple(m["span"] or ())) for m in status["members"])
        if spans != last:
            last, since = spans, time.monotonic()
        serving = sum(1 for _, s in spans if s)
        still = time.monotonic() - since > 20.0
        return serving >= members and still and bool(status["coverage"]["complete"])

    with contextlib.suppress(DidNotHappen):  # past SETTLE_S: the spans as they are
        await until(quiet, "the spans settling", SETTLE_S, every_s=2.0)
    return status


async def joined(http: aiohttp.ClientSession, address: str, newcomer: str) -> None:
    """Until `address` sees `newcomer` as an alive member (it announces itself once loaded)."""

    async def alive() -> bool:
        members = (await status_of(http, address))["members"]
        return any(m["address"] == newcomer and m["state"] == "alive" for m in members)

    await until(alive, f"{newcomer} joining", JOIN_S, every_s=2.0)


async def within_bound(
    http: aiohttp.ClientSession,
    address: str,
    pids: dict[str, int],
    store: ModelStore,
    fixed: int,
    members: int,
) -> list[dict[str, Any]]:
    """Rows once spans have settled and every node is within its bound, or RELEASE_S after
    they settled: a moved node keeps its old shard until no session uses it and others
    announce its layers (make-before-break), and holds both until then."""
    await settled(http, address, members)
    rows: list[dict[str, Any]] = []

    async def within() -> bool:
        nonlocal rows
        rows = rows_of(await status_of(http, address), pids, store, fixed)
        return all(r["rss_anon"] <= r["bound"] for r in rows)

    with contextlib.suppress(DidNotHappen):  # the rows as they are: the caller judges them
        await until(within, "every node within its bound", RELEASE_S, every_s=2.0)
    return rows


async def run(cache: Path, tokens: int, join: bool) -> dict[str, Any]:
    """The whole bench; what it printed, as a dict (the opt-in test asserts on it)."""
    from harness.cluster import greedy_chat, start_cluster

    t0 = time.monotonic()
    ref = child("reference", cache, str(tokens))
    print(f"one process: {ref['text']!r} ({time.monotonic() - t0:.0f} s)")
    entry_only = child("profile", cache, "")
    print("entry-only process, MiB:", [(s, round(b / MIB)) for s, b in entry_only["steps"]])
    store = ModelStore.open(str(fixture_path()), cache, progress=False)
    layers = layer_bytes(store, 0, store.num_layers)
    runtime = runtime_for(cache)
    share = ["--layer-memory-bytes", str(int(LAYER_SHARE * layers)), "--threads", "1"]
    # a fourth node with room for no layer: everything a node holds besides its span
    empty = ["--layer-memory-bytes", "1", "--threads", "1"]
    result: dict[str, Any] = {"reference": ref["text"], "entry_only": entry_only["steps"]}
    # the nodes' logs stay there for a look at what moved when
    state = Path(tempfile.mkdtemp(prefix="bench-memory-", dir=cache))
    print(f"node logs: {state}")
    cluster = await start_cluster(
        runtime, state, [share, share, share, empty], 3, timeout_s=900, forked=False
    )
    try:
        pids = {a: p.pid for a, p in zip(cluster.addresses, cluster.processes, strict=True)}
        async with aiohttp.ClientSession() as http:
            answer = await greedy_chat(http, cluster.addresses[0], PROMPT, tokens)
            text = answer["choices"][0]["message"]["content"]
            print(f"swarm: {text!r} {'== one process' if text == ref['text'] else '!= ONE'}")
            await settled(http, cluster.addresses[0], 3)
            fixed = rss_anon(pids.pop(cluster.addresses[3])) - entry_bytes(store)
            result |= {"text": text, "fixed": fixed}
            rows = await within_bound(http, cluster.addresses[0], pids, store, fixed, 3)
            print_rows("three nodes", rows, fixed)
            result["three"] = rows
            if join:  # the empty node restarts with room for a quarter of the layers
                cluster.terminate(3)
                cluster.flags[3] = ["--layer-memory-bytes", str(int(JOIN_SHARE * layers))]
                cluster.flags[3] += ["--threads", "1"]
                cluster.start(3)
                pids[cluster.addresses[3]] = cluster.processes[3].pid
                # placement may leave one of four without a span (three hold the model):
                # the newcomer among the members, then every layer covered, once settled
                await joined(http, cluster.addresses[0], cluster.addresses[3])
                await wait_for_coverage(cluster.addresses[0], 3, 900)
                rows = await within_bound(http, cluster.addresses[0], pids, store, fixed, 3)
                answer = await greedy_chat(http, cluster.addresses[0], PROMPT, tokens)
                again = answer["choices"][0]["message"]["content"]
                print(f"after the join: {'== one process' if again == ref['text'] else '!='}")
                print_rows("after a fourth node joined and spans moved", rows, fixed)
                result |= {"joined": rows, "text_after_join": again}
    finally:
        cluster.stop()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE / "store")
    parser.add_argument("--tokens", type=int, default=8)
    parser.add_argument("--no-join", action="store_true")
    parser.add_argument("--profile", help="start:end, or '' for the entry pieces")
    parser.add_argument("--fresh", action="store_true", help="profile from an index-only cache")
    parser.add_argument("--reference", help="tokens: print one process's text as JSON")
    args = parser.parse_args()
    if args.profile is not None and args.fresh:
        store = ModelStore.open(str(fixture_path()), args.cache, progress=False)
        with tempfile.TemporaryDirectory(dir=args.cache.parent) as fresh:
            result = profile(index_copy(store, Path(fresh)), args.profile)
        print(json.dumps(result))
    elif args.profile is not None:
        result = profile(args.cache, args.profile)
        print(json.dumps(result))
    elif args.reference is not None:
        print(json.dumps(reference(args.cache, args.reference)))
    else:
        result = asyncio.run(run(args.cache, args.tokens, not args.no_join))
        print(json.dumps(result))


if __name__ == "__main__":
    main()

"""A local stand-in for a Hugging Face hub: the endpoints huggingface_hub calls to download
(a model's info at a revision, and HEAD and ranged GET of `resolve/<revision>/<file>` with the
hub's metadata headers), over repositories that are local folders. It logs every request, so a
test sees what a node downloaded. Runs on its own thread; point HF_ENDPOINT at `endpoint`."""

from __future__ import annotations

import asyncio
import hashlib
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from aiohttp import web

LFS_SUFFIXES = (".safetensors", ".gguf", ".bin")  # what the hub keeps in LFS
_RANGE = re.compile(r"^bytes=(\d+)-(\d*)$")


@dataclass(frozen=True)
class Logged:
    method: str
    repo: str
    file: str  # "" for the info API
    start: int = 0
    end: int = 0  # exclusive; a GET without a Range logs the whole file


@dataclass
class HubStandin:
    repos: dict[str, Path]  # "owner/name" -> the folder whose files it serves
    log: list[Logged] = field(default_factory=list)
    endpoint: str = ""
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None
    _runner: web.AppRunner | None = None

    def commit(self, repo: str) -> str:
        return hashlib.sha1(repo.encode(), usedforsecurity=False).hexdigest()

    def __enter__(self) -> HubStandin:
        ready = threading.Event()
        self._loop = asyncio.new_event_loop()

        def serve() -> None:
            assert self._loop is not None
            asyncio.set_event_loop(self._loop)
            self._loop.run_until_complete(self._start())
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=serve, daemon=True)
        self._thread.start()
        ready.wait(10)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._loop is not None and self._thread is not None
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_get("/api/models/{owner}/{name}", self._info)
        app.router.add_get("/api/models/{owner}/{name}/revision/{revision}", self._info)
        resolve = "/{owner}/{name}/resolve/{revision}/{file:.+}"
        app.router.add_route("HEAD", resolve, self._head)
        app.router.add_get(resolve, self._get, allow_head=False)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.endpoint = f"http://127.0.0.1:{port}"

    async def _stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def _repo(self, request: web.Request) -> tuple[str, Path]:
        repo = f"{request.match_info['owner']}/{request.match_info['name']}"
        if repo not in self.repos:
            raise web.HTTPNotFound(headers={"X-Error-Code": "RepoNotFound"}, text="no such repo")
        revision = request.match_info.get("revision", "main")
        if revision not in ("main", self.commit(repo)):
            raise web.HTTPNotFound(headers={"X-Error-Code": "RevisionNotFound"})
        return repo, self.repos[repo]

    async def _info(self, request: web.Request) -> web.Response:
        repo, folder = self._repo(request)
        self.log.append(Logged("INFO", repo, ""))
        files = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
        return web.json_response(
            {
                "id": repo,
                "modelId": repo,
                "sha": self.commit(repo),
                "private": False,
                "siblings": [{"rfilename": f} for f in files],
            }
        )

    def _file(self, request: web.Request) -> tuple[str, Path, dict[str, str]]:
        repo, folder = self._repo(request)
        name = request.match_info["file"]
        path = folder / name
        if ".." in name.split("/") or not path.is_file():
            raise web.HTTPNotFound(headers={"X-Error-Code": "EntryNotFound"})
        data = path.read_bytes()
        headers = {"X-Repo-Commit": self.commit(repo), "Accept-Ranges": "bytes"}
        if name.endswith(LFS_SUFFIXES):
            sha = hashlib.sha256(data).hexdigest()
            headers |= {"ETag": f'"{sha}"', "X-Linked-Etag": f'"{sha}"'}
            headers["X-Linked-Size"] = str(len(data))
        else:  # git's blob hash
            blob = hashlib.sha1(f"blob {len(data)}\0".encode() + data, usedforsecurity=False)
            headers["ETag"] = f'"{blob.hexdigest()}"'
        return repo, path, headers

    async def _head(self, request: web.Request) -> web.Response:
        repo, path, headers = self._file(request)
        self.log.append(Logged("HEAD", repo, request.match_info["file"]))
        headers["Content-Length"] = str(path.stat().st_size)
        return web.Response(headers=headers)

    async def _get(self, request: web.Request) -> web.Response:
        repo, path, headers = self._file(request)
        data = path.read_bytes()
        start, end, status = 0, len(data), 200
        match = _RANGE.match(request.headers.get("Range", ""))
        if match:
            start = int(match[1])
            end = min(len(data), int(match[2]) + 1) if match[2] else len(data)
            if start >= len(data) or end <= start:
                raise web.HTTPRequestRangeNotSatisfiable()
            status = 206
            headers["Content-Range"] = f"bytes {start}-{end - 1}/{len(data)}"
        self.log.append(Logged("GET", repo, request.match_info["file"], start, end))
        return web.Response(body=data[start:end], status=status, headers=headers)

    def fetched(self, repo: str, file: str) -> list[tuple[int, int]]:
        """The byte ranges of `file` GET requests asked for, merged."""
        spans = sorted(
            (r.start, r.end)
            for r in self.log
            if r.method == "GET" and (r.repo, r.file) == (repo, file)
        )
        merged: list[tuple[int, int]] = []
        for start, end in spans:
            if merged and start <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
            else:
                merged.append((start, end))
        return merged

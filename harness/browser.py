"""Headless Chromium driven over its DevTools protocol (a websocket, spoken with aiohttp), for
tests that must click and type on a page, not only render it (tests/test_swarm_e2e.py's
dashboard test renders with --dump-dom)."""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import shutil
from pathlib import Path
from types import TracebackType
from typing import Any

import aiohttp
import pytest

from harness.polling import until


def chromium() -> str | None:
    return next(
        (p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p),
        None,
    )


def chromium_or_skip() -> str:
    """The browser, or the test skips saying how to get one."""
    found = chromium()
    if found is None:
        pytest.skip("headless Chromium is not installed (apt-get install chromium; .ci/run does)")
    return found


class DevToolsError(Exception):
    """A DevTools command that failed (its message)."""


class PageError(Exception):
    """An expression that threw in the page (its description)."""


class Browser:
    """One headless Chromium with one page. `async with Browser(path, profile) as page`."""

    def __init__(self, executable: str, profile: Path, size: str = "1200,860") -> None:
        self._argv = [
            executable,
            "--headless",
            "--no-sandbox",  # CI runs as root
            "--disable-gpu",
            "--hide-scrollbars",
            f"--window-size={size}",
            f"--user-data-dir={profile}",
            "--remote-debugging-port=0",  # the port it took is written into the profile
            "about:blank",
        ]
        self._profile = profile
        self._ids = itertools.count(1)
        self._process: asyncio.subprocess.Process | None = None
        self._http: aiohttp.ClientSession | None = None
        self._ws: aiohttp.ClientWebSocketResponse | None = None

    async def __aenter__(self) -> Browser:
        self._process = await asyncio.create_subprocess_exec(
            *self._argv, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL
        )
        port_file = self._profile / "DevToolsActivePort"

        def written() -> str:
            return port_file.read_text().strip() if port_file.is_file() else ""

        port = (await until(written, "Chromium opening its DevTools port", 60)).split()[0]
        self._http = aiohttp.ClientSession()
        async with self._http.get(f"http://127.0.0.1:{port}/json/list") as r:
            pages = [t for t in await r.json() if t["type"] == "page"]
        self._ws = await self._http.ws_connect(pages[0]["webSocketDebuggerUrl"], max_msg_size=0)
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._ws is not None:
            await self._ws.close()
        if self._http is not None:
            await self._http.close()
        if self._process is not None and self._process.returncode is None:
            self._process.kill()
            await self._process.wait()

    async def send(self, method: str, **params: Any) -> dict[str, Any]:
        """One DevTools command's result (events that arrive meanwhile are dropped)."""
        assert self._ws is not None
        number = next(self._ids)
        await self._ws.send_str(json.dumps({"id": number, "method": method, "params": params}))
        async with asyncio.timeout(60):
            while True:
                message = json.loads((await self._ws.receive()).data)
                if message.get("id") == number:
                    if "error" in message:
                        raise DevToolsError(message["error"].get("message", str(message)))
                    result: dict[str, Any] = message["result"]
                    return result

    async def open(self, url: str) -> None:
        await self.send("Page.navigate", url=url)
        await self.wait_for("document.readyState === 'complete'")

    async def evaluate(self, expression: str) -> Any:
        """The expression's value (awaited when it is a promise), as JSON."""
        reply = await self.send(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in reply:
            details = reply["exceptionDetails"]
            raise PageError(details.get("exception", {}).get("description", str(details)))
        return reply["result"].get("value")

    async def wait_for(self, expression: str, timeout_s: float = 120.0) -> Any:
        """Poll until `expression` is truthy; its value. While a page is loading (or being
        navigated away from) the expression may fail or meet no element: not yet true."""
        return await until(
            lambda: self.evaluate(expression),
            f"`{expression}` being true",
            timeout_s,
            ignoring=(PageError, DevToolsError),
        )

    async def type(self, selector: str, text: str) -> None:
        """Focus the element and type `text` into it as keyboard input would."""
        await self.evaluate(f"document.querySelector({json.dumps(selector)}).focus()")
        await self.send("Input.insertText", text=text)

    async def click(self, selector: str) -> None:
        await self.evaluate(f"document.querySelector({json.dumps(selector)}).click()")

    async def viewport(self, width: int, height: int, mobile: bool) -> None:
        """Lay pages out on a screen of `width` x `height` CSS pixels from now on. `mobile`:
        as a phone does, which reads the page's viewport tag and zooms out of a page wider
        than the screen (window.innerWidth then grows past `width`)."""
        await self.send(
            "Emulation.setDeviceMetricsOverride",
            width=width,
            height=height,
            deviceScaleFactor=1,
            mobile=mobile,
        )

    async def screenshot(self, path: Path, whole_page: bool = False) -> None:
        """A PNG of what the window shows, or of the whole page's height."""
        options: dict[str, Any] = {}
        if whole_page:
            width, height = await self.evaluate(
                "[innerWidth, document.documentElement.scrollHeight]"
            )
            clip = {"x": 0, "y": 0, "width": width, "height": height, "scale": 1}
            options = {"captureBeyondViewport": True, "clip": clip}
        shot = await self.send("Page.captureScreenshot", format="png", **options)
        await asyncio.to_thread(path.write_bytes, base64.b64decode(shot["data"]))

"""The chat page and the dashboard at a phone's width (400 px, laid out as a phone does) and a
laptop's (1280 px), in headless Chromium against a real node: no page is wider than the
window, every table fits its box, the message box takes most of the line, the dashboard
counts its members in words that agree with the number. The screenshots land in
artifacts/screenshots/ (docs/screenshots/ holds copies)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.browser import Browser, chromium_or_skip
from harness.cluster import Cluster, serving_cluster
from harness.paths import REPO
from swarm.config import RuntimeConfig

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

HEIGHT = 800
SHOTS = REPO / "artifacts" / "screenshots"
ANSWER = "document.querySelector('.msg.assistant')"
# the page's width against the window's, and each table box's against its own width
FIT = """({page: document.documentElement.scrollWidth, window: innerWidth,
  boxes: [...document.querySelectorAll('.scroll')].map(b => [b.scrollWidth, b.clientWidth])})"""


@pytest.fixture(scope="module")
def browser_path() -> str:
    return chromium_or_skip()


@pytest.fixture(scope="module")
def node(
    smol_runtime: RuntimeConfig, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    yield from serving_cluster(smol_runtime, tmp_path_factory, [["--threads", "1"]])


async def _fits(page: Browser, width: int) -> None:
    fit = await page.evaluate(FIT)
    assert fit["window"] == width, fit  # a phone zooms out of a page wider than the screen
    assert fit["page"] <= width, fit
    assert all(inner <= box for inner, box in fit["boxes"]), fit


@pytest.mark.parametrize("width", [400, 1280])
async def test_both_pages_fit_the_window(
    browser_path: str,  # first: where it skips, no node starts
    node: Cluster,
    tmp_path: Path,
    width: int,
) -> None:
    address = node.addresses[0]
    SHOTS.mkdir(parents=True, exist_ok=True)
    async with Browser(browser_path, tmp_path / "profile", size=f"{width},{HEIGHT}") as page:
        await page.viewport(width, HEIGHT, mobile=width < 600)

        await page.open(f"http://{address}/chat")
        await page.wait_for("document.getElementById('model').textContent.includes('context')")
        await page.evaluate("document.getElementById('temperature').value = '0'")
        await page.evaluate("document.getElementById('max-tokens').value = '24'")
        await page.type("#input", "What is the capital of France?")
        await page.click("#send")
        await page.wait_for(f"{ANSWER} && {ANSWER}.dataset.state === 'done'")
        await _fits(page, width)
        box = await page.evaluate("document.getElementById('input').getBoundingClientRect().width")
        assert box >= 0.6 * width, box
        await page.screenshot(SHOTS / f"chat-{width}.png")

        await page.open(f"http://{address}/")
        await page.wait_for("!!document.querySelector('tr.member')")
        await page.wait_for("!!document.querySelector('tr.request')")
        title = await page.evaluate("document.getElementById('model').textContent")
        assert title.endswith(" · 30 layers · 1 member"), title
        assert await page.evaluate("plural(3, 'member')") == "3 members"
        await _fits(page, width)
        await page.screenshot(SHOTS / f"dashboard-{width}.png", whole_page=True)

"""The chat page (/chat) in headless Chromium against a real node that needs an API token and
takes one request at a time: an answer streams in with its route and per-hop timings, the
conversation is kept, regenerate asks again, stop aborts mid-answer (the node sees the request
go away), 401 and 429 become readable messages; the renderer escapes whatever the model
writes. The screenshot lands in artifacts/chat.png (docs/chat.png is a copy of one)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from harness.browser import Browser, chromium_or_skip
from harness.cluster import Cluster, newest_request, node_behind_token
from harness.paths import REPO
from harness.polling import until
from swarm.client import SwarmClient
from swarm.config import RuntimeConfig
from swarm.demo import free_ports, start_node, stop_nodes
from swarm.errors import SwarmError

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

TOKEN = "chat-page-token-0123456789"
LAST = "[...document.querySelectorAll('.msg.assistant')].pop()"


@pytest.fixture(scope="module")
def node(
    smol_runtime: RuntimeConfig, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    # one request at a time and no queue: a second one is refused at once
    api = "max_concurrent_requests = 1\nqueue_size = 0\n"
    yield from node_behind_token(smol_runtime, tmp_path_factory, TOKEN, api)


@pytest.fixture
def browser_path() -> str:
    return chromium_or_skip()


async def _ask(page: Browser, text: str) -> dict[str, str]:
    """Type and send `text`; the answer's state, text and updates once it ended."""
    await page.type("#input", text)
    await page.click("#send")
    await page.wait_for(f"{LAST} && {LAST}.dataset.state !== 'streaming'")
    return await _last(page)


async def _last(page: Browser) -> dict[str, str]:
    answer: dict[str, str] = await page.evaluate(
        f"({{state: {LAST}.dataset.state, text: {LAST}.querySelector('.body').innerText, "
        f"updates: {LAST}.dataset.updates}})"
    )
    return answer


async def test_a_conversation_streams_regenerates_and_stops(
    node: Cluster, browser_path: str, tmp_path: Path
) -> None:
    address = node.addresses[0]
    node_id = (await SwarmClient(address, token=TOKEN).status()).node.id
    seen = len((await SwarmClient(address, token=TOKEN).status()).recent_requests)
    async with Browser(browser_path, tmp_path / "profile") as page:
        await page.open(f"http://{address}/chat#token={TOKEN}")
        await page.wait_for("document.getElementById('model').textContent.includes('context')")
        await page.evaluate("document.getElementById('temperature').value = '0'")

        first = await _ask(page, "What is the capital of France?")
        assert first["state"] == "done" and "Paris" in first["text"]
        assert int(first["updates"]) > 3  # it came in pieces, not at once
        trace = await page.evaluate("document.getElementById('trace').innerText")
        assert f"route {node_id}[0:30]" in trace and "compute" in trace, trace
        asked = await newest_request(address, seen + 1, TOKEN)

        await page.click("#regenerate")  # the same question again: greedy, the same answer
        await page.wait_for(f"{LAST}.dataset.state === 'done' && +{LAST}.dataset.updates > 0")
        assert (await _last(page))["text"] == first["text"]
        assert await page.evaluate("document.querySelectorAll('.msg').length") == 2
        again = await newest_request(address, seen + 2, TOKEN)
        assert again.prompt_tokens == asked.prompt_tokens  # the old answer is not sent

        code = await _ask(page, "Write a Python function that adds two numbers.")
        assert code["state"] == "done"
        later = await newest_request(address, seen + 3, TOKEN)
        assert later.prompt_tokens > asked.prompt_tokens + asked.completion_tokens  # history
        screenshot = REPO / "artifacts" / "chat.png"
        screenshot.parent.mkdir(exist_ok=True)
        await page.screenshot(screenshot)
        assert screenshot.stat().st_size > 10_000

        await page.evaluate("document.getElementById('max-tokens').value = '400'")
        await page.type("#input", "Write a long story about a dragon who learns to cook.")
        await page.click("#send")
        await page.wait_for(f"{LAST}.querySelector('.body').innerText.length > 40")
        await page.click("#stop")
        await page.wait_for(f"{LAST}.dataset.state === 'stopped'")
        stopped = await newest_request(address, seen + 4, TOKEN)
        assert stopped.outcome == "disconnected" and stopped.completion_tokens < 400
        assert await page.evaluate("document.getElementById('send').disabled") is False

        await page.type("#input", "Tell me about the sea.")  # Clear while it streams
        await page.click("#send")
        await page.wait_for(f"{LAST}.querySelector('.body').innerText.length > 10")
        await page.click("#clear")
        await page.wait_for("running === null")
        assert await page.evaluate("history.length + document.querySelectorAll('.msg').length") == 0


async def test_refusals_are_readable_messages(
    node: Cluster, browser_path: str, tmp_path: Path
) -> None:
    address = node.addresses[0]
    async with Browser(browser_path, tmp_path / "profile") as page:
        await page.open(f"http://{address}/chat")  # no token
        await page.wait_for("document.getElementById('model').textContent.includes('401')")
        refused = await _ask(page, "hello")
        assert refused["state"] == "error" and "needs an API token (401)" in refused["text"]
        assert "#token=" in refused["text"]

        await page.open("about:blank")  # else only the fragment changes: the page stays
        await page.open(f"http://{address}/chat#token={TOKEN}")
        await page.wait_for("document.getElementById('model').textContent.includes('context')")
        body = {"messages": [{"role": "user", "content": "Tell me a long story."}]}
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with (
            aiohttp.ClientSession() as http,
            http.post(
                f"http://{address}/v1/chat/completions",
                json={**body, "max_tokens": 400, "stream": True},
                headers=headers,
            ) as busy,
        ):
            await busy.content.readline()  # streaming: the node's one slot is taken
            refused = await _ask(page, "hello")
        assert refused["state"] == "error" and "busy (429)" in refused["text"], refused


INJECTIONS = [
    ("<img src=x onerror=alert(1)>", "<p>&lt;img src=x onerror=alert(1)&gt;</p>"),
    ("**bold** and `<b>`", "<p><strong>bold</strong> and <code>&lt;b&gt;</code></p>"),
    (
        "```html\n<script>alert(1)</script>\n```",
        '<pre><code class="language-html">&lt;script&gt;alert(1)&lt;/script&gt;</code></pre>',
    ),
    ("- a\n- <i>b</i>", "<ul><li>a</li><li>&lt;i&gt;b&lt;/i&gt;</li></ul>"),
    ("1. one\n2. two", "<ol><li>one</li><li>two</li></ol>"),
    ("# Title\ntext *it*", "<h3>Title</h3><p>text <em>it</em></p>"),
    ("**<svg onload=x>**", "<p><strong>&lt;svg onload=x&gt;</strong></p>"),
    ("\"q\" & 'a'", "<p>&quot;q&quot; &amp; &#39;a&#39;</p>"),
    ("```\nstill streaming <b>", "<pre><code>still streaming &lt;b&gt;</code></pre>"),
    ('```py"><img src=x>\n```', '<pre><code class="language-py"></code></pre>'),
    ("a\nb\n\nc", "<p>a<br>b</p><p>c</p>"),
]


async def test_the_renderer_escapes_everything_the_model_writes(
    node: Cluster, browser_path: str, tmp_path: Path
) -> None:
    address = node.addresses[0]
    async with Browser(browser_path, tmp_path / "profile") as page:
        await page.open(f"http://{address}/chat#token={TOKEN}")
        for source, html in INJECTIONS:
            assert await page.evaluate(f"renderMarkdown({json.dumps(source)})") == html, source
        everything = "\n\n".join(source for source, _ in INJECTIONS)
        await page.evaluate(f"showAnswer(bubble('assistant'), {json.dumps(everything)})")
        assert await page.evaluate("document.querySelectorAll('#log img, #log script').length") == 0
        shown = await page.evaluate("document.getElementById('log').innerText")
        assert "<img src=x onerror=alert(1)>" in shown and "<script>alert(1)</script>" in shown


async def test_missing_layers_are_named(
    smol_runtime: RuntimeConfig, browser_path: str, tmp_path: Path
) -> None:
    """A node alone that serves only layers 0:10: the answer is a 503 naming the rest."""
    (port,) = free_ports(1)
    address = f"127.0.0.1:{port}"
    flags = ["--threads", "1", "--span", "0:10"]
    process = start_node(port, None, tmp_path / "state", smol_runtime, flags)
    try:
        client = SwarmClient(address)

        async def serving() -> bool:
            return (await client.status()).node.span is not None

        await until(serving, "the node serving", 120, every_s=0.3, ignoring=(SwarmError,))
        async with Browser(browser_path, tmp_path / "profile") as page:
            await page.open(f"http://{address}/chat")
            refused = await _ask(page, "hello")
    finally:
        stop_nodes([process])
    assert refused["state"] == "error", refused
    assert (
        "cannot answer now (503)" in refused["text"] and "Missing layers: 10:30" in refused["text"]
    )


async def test_the_dashboard_links_to_the_chat_page_with_its_token(
    node: Cluster, browser_path: str, tmp_path: Path
) -> None:
    address = node.addresses[0]
    async with Browser(browser_path, tmp_path / "profile") as page:
        await page.open(f"http://{address}/#token={TOKEN}")
        link = await page.evaluate("document.getElementById('chat-link').href")
        assert link == f"http://{address}/chat#token={TOKEN}"
        await page.click("#chat-link")
        await page.wait_for("document.getElementById('model').textContent.includes('context')")
        back = await page.evaluate("document.getElementById('dashboard-link').href")
        assert back == f"http://{address}/#token={TOKEN}"

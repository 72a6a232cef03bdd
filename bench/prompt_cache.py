"""The prompt cache through 3 node processes on loopback (memory limits force a split into 3
hops, one torch thread each): time to first token, as the client sees it streamed, with the
cache on and with `"cache_prompt": false` on every request, both sides in one sitting.

conversation: a system prompt and --turns user turns, each request sending the whole
conversation so far, as chat clients do; each side keeps its own history of the model's
answers. Per turn: prompt tokens, the tokens the cache gave, TTFT each way; the headline is
TTFT(last turn) / TTFT(turn 1) per side (the target with the cache: at most 1.3x).

agent: a ~2,000-token system prompt (instructions and tool schemas as JSON text) and
--requests short user requests, each sent alone after it, as an agent loop's calls are.
TTFT of request 1, and the median and max of the others' as a fraction of it (the target
with the cache: at most 15%).

restart: the agent's first requests on 3 fresh nodes (request 1 cold), then every node
stopped at once with SIGTERM (each writes its kept blocks to its state folder and the span
it served beside its id) and started again on
the same ports and state; after a warm-up, request 1 again with the cache, then without it.
TTFT after the restart as a fraction of the cold one before it, and of the one without the
cache after it (the target: at most 25%). Blocks are read back only by a node that serves
the very span again: the spans before and after are printed.

Each request is sent both ways back to back, the order alternating, so both sides see the
same minute of this machine (its speed swings under others' load). A request without the
cache keeps nothing, so the cached side still starts cold at turn 1 / request 1. Each round
(--repeats) dates its system prompts a day later: every block of a prompt is named by all the
tokens up to its end, so a round shares nothing with the one before. Greedy, so each answer
with the cache must be the same text as without it: a difference is printed, not hidden, as
are requests the entry re-routed (and replayed whole) and routes whose spans moved (blocks
are kept per span): both change what a row measures. Figures with several rounds are medians
over the rounds.

    python -m bench.prompt_cache [--turns 10] [--requests 20] [--repeats 1] [--max-tokens 56]
        [--agent-max-tokens 16] [--parts conversation,agent,restart]
        [--model PATH --off-turns 1,5,10]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime
import json
import signal
import statistics
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.cluster import Cluster, start_cluster
from harness.loopback import split_flags, split_swarm
from harness.paths import MODEL_CACHE
from harness.streams import follow
from swarm.client import SwarmClient
from swarm.config import RuntimeConfig
from swarm.demo import wait_for_coverage
from swarm.errors import SwarmError
from swarm.schema import Span

Message = dict[str, str]
REFUSALS_BORNE = 120  # 503s a request is asked again after (a second apart), then it fails
FIRST_DAY = datetime.date(2025, 5, 1)  # round r's prompts are dated r days after it

# The prompts are most of this file (over ~400 lines): written out, so that what is measured
# is plain to read and the same from run to run.

CHAT_SYSTEM = (
    "Today is {date}. You are Trailmate, a friendly assistant for people planning outdoor "
    "trips. Give practical, specific advice in short paragraphs or short lists. When safety "
    "matters, say so plainly. If the user pastes code or text, work with exactly what they "
    "pasted. Keep each answer under 150 words."
)
CHAT_TURNS = [
    "Hi! Three friends and I are planning a three-day hike on the West Highland Way in "
    "Scotland at the end of May. We're fairly fit and walk a lot, but none of us has done a "
    "multi-day trek before. What should we sort out first?",
    "Here's the gear list I've put together so far. What's missing or unnecessary?\n"
    "- 45 L backpack with rain cover\n- waterproof jacket and trousers\n"
    "- two merino t-shirts, one fleece\n- trail runners (no boots)\n- head torch, power bank\n"
    "- paper map and compass\n- water filter, two 1 L bottles\n"
    "- sleeping bag rated to 5 °C\n- a cotton hoodie for the evenings\n"
    "- first-aid kit, sun cream",
    "We'll stay in bunkhouses, not tents. Does that change what we need to carry?",
    "I wrote a little script to split our costs, but the totals come out wrong when someone "
    "pays for the whole group. Can you spot the bug?\n```python\ndef split(expenses, people):\n"
    "    balance = {p: 0.0 for p in people}\n    for payer, amount in expenses:\n"
    "        share = amount / len(people)\n        for p in people:\n"
    "            balance[p] -= share\n        balance[payer] += share\n    return balance\n\n"
    'print(split([("ana", 120.0), ("ben", 45.0)], ["ana", "ben", "cal", "dee"]))\n```',
    "Can you make this message to the group chat shorter and friendlier? 'Hello all. I have "
    "booked the bunkhouses for the nights of the 29th and 30th and paid the deposits, which "
    "came to £96 in total. Please transfer your share to me by the end of next week. Also "
    "please confirm that you have the correct footwear, as I do not want anyone to get "
    "injured on the first day.'",
    "What could we cook for three dinners with one small gas stove and no fridge? Two of us "
    "are vegetarian.",
    "This is our plan. Is day two too long for first-timers?\n"
    "Day 1: Milngavie to Drymen, 19 km, 250 m ascent\n"
    "Day 2: Drymen to Rowardennan via Conic Hill, 24 km, 600 m ascent\n"
    "Day 3: Rowardennan to Inversnaid, 11 km, 300 m ascent, then the ferry across Loch Lomond\n"
    "We plan to start walking at 9 each morning and stop for an hour at lunch.",
    "What's the best way to deal with a blister if one of us gets one on the trail?",
    "On the map I keep seeing words like Beinn, Sgùrr, Allt, Coire, Lochan and Bealach. What "
    "do they mean?",
    "Thanks, this has been really helpful. Could you sum up everything we've discussed as a "
    "short checklist I can print and stick on the fridge?",
]


def _tool(name: str, description: str, **params: str) -> dict[str, Any]:
    """An OpenAI-style function schema. Each parameter is "type: description", required
    unless its description starts with "optional"."""
    specs = {p: spec.split(": ", 1) for p, spec in params.items()}
    properties = {p: {"type": kind, "description": text} for p, (kind, text) in specs.items()}
    required = [p for p, (_, text) in specs.items() if not text.startswith("optional")]
    parameters = {"type": "object", "properties": properties, "required": required}
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": parameters},
    }


# the system prompt's tools: what an agent framework writes into it as JSON text
AGENT_TOOLS = [
    _tool(
        "lookup_customer",
        "Find a customer account by email, phone number or customer id.",
        query="string: an email address, a phone number or a numeric customer id",
        include_orders="boolean: optional; also return the customer's last 10 orders",
    ),
    _tool(
        "search_orders",
        "Search orders by customer, status, date range, total or shipping.",
        customer_id="string: optional; only this customer's orders",
        status="string: optional; one of processing, shipped, delivered, returned, cancelled",
        placed_after="string: optional; ISO date, inclusive",
        placed_before="string: optional; ISO date, exclusive",
        min_total_gbp="number: optional; only orders whose total is at least this",
        shipping="string: optional; one of standard, express, click_and_collect",
    ),
    _tool(
        "get_order",
        "Everything about one order: lines, payments, shipments and returns.",
        order_id="string: the order number, such as NW-20417",
    ),
    _tool(
        "issue_refund",
        "Refund an order in full or in part, as money or as store credit.",
        order_id="string: the order number",
        amount_gbp="number: optional; the amount to refund; the whole order if left out",
        method="string: one of original_payment or store_credit",
        reason="string: why, in one sentence, for the finance team's records",
    ),
    _tool(
        "update_shipping_address",
        "Change where an order that has not shipped yet goes.",
        order_id="string: the order number",
        address="string: the full new address, one line, postcode last",
        notify_customer="boolean: optional; email the customer a confirmation",
    ),
    _tool(
        "check_inventory",
        "Stock of one product in each warehouse, by size and colour.",
        product="string: a product name or SKU",
        warehouse="string: optional; one of leeds, bristol, glasgow; every one if left out",
        variant="string: optional; a size or a colour, such as 42 or green",
    ),
    _tool(
        "create_support_ticket",
        "Open a ticket for the support or engineering team.",
        title="string: a one-line summary",
        details="string: what happened, what was expected, and any order numbers",
        priority="string: one of low, normal, high, urgent",
        team="string: one of support, warehouse, payments, web",
    ),
    _tool(
        "send_email",
        "Send an email to a customer or a partner from the shop's address.",
        to="string: the recipient's email address or customer id",
        subject="string: the subject line",
        body="string: the plain-text body, signed as Northwind Outdoor",
    ),
    _tool(
        "schedule_callback",
        "Book, move or cancel a phone call back to a customer.",
        phone="string: the number to call",
        when="string: ISO date and time, UK time; empty to cancel",
        topic="string: what the call is about, for whoever makes it",
    ),
    _tool(
        "apply_discount_code",
        "Create a one-use discount code for one customer.",
        customer_id="string: the customer's id",
        percent="integer: the discount, from 5 to 30",
        expires="string: optional; ISO date; 90 days from today if left out",
    ),
]
AGENT_SYSTEM = (
    "Current date: {date}. You are OpsBot, the operations agent of Northwind Outdoor, an "
    "online shop in the UK that sells camping and hiking gear. Staff in customer service, the "
    "warehouses and finance send you requests in plain English. You act through the tools "
    "below and nothing else: you cannot see the shop's systems except through them.\n\n"
    "Rules:\n"
    "1. Answer each request with exactly one tool call as a JSON object, "
    '{{"name": ..., "arguments": {{...}}}}, and no other text. The first call of a task '
    "gathers what the later ones need; never guess an order number, a customer id or an "
    "amount.\n"
    "2. Refunds above £250, refunds to a different payment method and any change to an "
    "order that has shipped need a human: open a ticket for the payments or warehouse team "
    "instead.\n"
    "3. Emails to customers are short, polite and specific: the order number, what happens "
    "next and when. Never promise a date the tools did not give you.\n"
    "4. Customer data is personal data: never put an email address, a phone number or an "
    "address in a ticket title, and never send one customer's details to another.\n"
    "5. Money is in pounds sterling with two decimals; dates and times are ISO 8601, UK "
    "time.\n"
    "6. When a request is ambiguous, call the tool that finds out rather than asking.\n\n"
    "Tools:\n{tools}"
)
AGENT_REQUESTS = [
    "Customer jane.doe@example.com says her order of two tent peg sets never arrived. Can you "
    "check what happened?",
    "How many Trailblazer 45 L backpacks in green do we have left in the Leeds warehouse?",
    "Refund order NW-20417 in full; the sleeping bag arrived with a broken zip and the "
    "customer sent photos.",
    "Mark Owens wants order NW-20533 shipped to 14 Harbour Street, Whitby YO21 3PU instead of "
    "his home address.",
    "Find all orders from the last 7 days that are still processing and have express shipping.",
    "Email Priya Shah an apology for the delay on order NW-20388 and give her the new delivery "
    "date, 6 May.",
    "Open a high-priority ticket: the checkout shows the wrong VAT on orders shipped to "
    "Northern Ireland.",
    "A caller wants someone to ring her back tomorrow afternoon about a bulk order for a scout "
    "group. Her number is 07700 900123.",
    "Give customer 88231 a 15% discount code for their next order: their last parcel was left "
    "in the rain.",
    "Is the Summit Pro stove in stock anywhere? A customer in Bristol needs it by Friday.",
    "What did tom.barker@example.co.uk order in March, and has any of it come back?",
    "Order NW-20602 was charged twice. Please refund the duplicate payment of £64.50 only.",
    "Can we still change the delivery address on order NW-20611 before it leaves the warehouse?",
    "Email the Glasgow hiking club to confirm that their 12 rain jackets ship on Monday.",
    "List every order above £500 placed this week so that finance can review them.",
    "The customer on ticket T-5521 has waited four days for a reply. Get it looked at today.",
    "How many pairs of Ridge trail shoes in size 42 are left across all the warehouses?",
    "Move Mr Lewis's callback from Thursday to Friday at 10 am; his number is 07700 900456.",
    "A camping chair came back with a bent leg. Give store credit, not cash, for order NW-20477.",
    "Look up the account for phone number 07700 900789 and tell me when they last ordered.",
]


@dataclass(frozen=True)
class Answer:
    text: str
    ttft_s: float  # from the request going out to its first piece of text, client side
    prompt_tokens: int
    cached_tokens: int  # prompt tokens the hops' kept blocks gave (usage.prompt_tokens_details)
    route: tuple[Span, ...]  # each hop's layers: blocks are kept per span, a move loses them
    reroutes: tuple[str, ...]  # why the entry re-routed and replayed it, where it did
    refused: tuple[str, ...] = ()  # 503s answered first (asked again after a second)


async def ask(
    client: SwarmClient, messages: Sequence[Message], max_tokens: int, cache: bool
) -> Answer:
    body = {
        "messages": list(messages),
        "max_tokens": max_tokens,
        "temperature": 0,
        "cache_prompt": cache,
    }
    refused: list[str] = []
    while True:
        try:
            stream = await follow(client.chat(body))
            break
        except SwarmError as e:  # a client asks again after a 503, as its Retry-After says
            if "(503)" not in str(e) or len(refused) >= REFUSALS_BORNE:
                raise
            refused.append(str(e))
            await asyncio.sleep(1.0)
    # an answer with no text (the model stopped at once) has no first token: its whole time
    first = stream.stamps[0] if stream.stamps else time.perf_counter()
    details = stream.usage.get("prompt_tokens_details") or {}
    trace = stream.trace
    return Answer(
        stream.answer,
        first - stream.started,
        int(stream.usage.get("prompt_tokens", 0)),
        int(details.get("cached_tokens", 0)),
        tuple(hop.layers for hop in trace.route) if trace else (),
        tuple(f.reason for f in trace.failovers) if trace else (),
        tuple(refused),
    )


# cache on (True) and off (False): one answer per request, None where that side was not asked
Sides = dict[bool, list[Answer | None]]
BOTH = (True, False)


async def both_ways(
    client: SwarmClient, messages: dict[bool, list[Message]], on_first: bool, max_tokens: int
) -> dict[bool, Answer]:
    """One request with the cache and without, back to back; `messages[cache]` is each
    side's (a conversation's sides differ once an answer does)."""
    order = BOTH if on_first else BOTH[::-1]
    return {cache: await ask(client, messages[cache], max_tokens, cache) for cache in order}


async def conversation(
    client: SwarmClient,
    system: str,
    turns: Sequence[str],
    max_tokens: int,
    off_turns: frozenset[int] | None = None,
) -> Sides:
    """The conversation both ways, each side's history holding its own answers, as a chat
    client's would: an answer that differs changes that side's later prompts. `off_turns`
    (numbered from 1): the turns asked without the cache too, on the cached side's history
    (a big model's uncached turns take minutes each); None: every turn, each side its own."""
    history = {cache: [{"role": "system", "content": system}] for cache in BOTH}
    sides: Sides = {cache: [] for cache in BOTH}
    for i, user in enumerate(turns):
        for cache in BOTH:
            history[cache].append({"role": "user", "content": user})
        if off_turns is None:
            answers = await both_ways(client, history, i % 2 == 0, max_tokens)
        else:
            answers = {True: await ask(client, history[True], max_tokens, True)}
            if i + 1 in off_turns:
                answers[False] = await ask(client, history[True], max_tokens, False)
        for cache in BOTH:
            sides[cache].append(answers.get(cache))
            text = answers[cache if off_turns is None else True].text
            history[cache].append({"role": "assistant", "content": text})
    return sides


async def agent_loop(
    client: SwarmClient, system: str, requests: Sequence[str], max_tokens: int
) -> Sides:
    """Each request alone after the system prompt, both ways: an agent's calls share only
    the system prompt."""
    sides: Sides = {cache: [] for cache in BOTH}
    for i, user in enumerate(requests):
        messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        answers = await both_ways(client, dict.fromkeys(BOTH, messages), i % 2 == 0, max_tokens)
        for cache, answer in answers.items():
            sides[cache].append(answer)
    return sides


@dataclass(frozen=True)
class Restarted:
    cold: Answer  # request 1 on fresh nodes, with the cache (nothing kept yet)
    after: Answer  # request 1 again after every node was stopped and started, with the cache
    uncached: Answer  # and then without it
    spans: tuple[tuple[Span | None, ...], tuple[Span | None, ...]]  # each node's, before/after


async def _spans(cluster: Cluster) -> tuple[Span | None, ...]:
    status = await SwarmClient(cluster.addresses[0]).status()
    by_address = {m.address: m.span for m in status.members if m.state == "alive"}
    return tuple(by_address.get(a) for a in cluster.addresses)


async def agent_restart(
    runtime: RuntimeConfig, flags: list[str], system: str, requests: Sequence[str], tokens: int
) -> Restarted:
    """The agent's first requests on fresh nodes, every node stopped (SIGTERM) and started
    again on its port and state folder, then request 1 again both ways."""
    asks = [
        [{"role": "system", "content": system}, {"role": "user", "content": r}] for r in requests
    ]
    hello = [{"role": "user", "content": "Hello!"}]
    with tempfile.TemporaryDirectory() as state:
        cluster = await start_cluster(runtime, Path(state), [flags] * 3, expect_serving=3)
        try:
            client = SwarmClient(cluster.addresses[0])
            await ask(client, hello, 8, False)
            cold = await ask(client, asks[0], tokens, True)
            for messages in asks[1:]:
                await ask(client, messages, tokens, True)
            before = await _spans(cluster)
            # at once, as a lab loses power: one by one, the last ones would move to fill
            # the holes of the first (and keep the blocks of the layers they moved to)
            for process in cluster.processes:
                process.send_signal(signal.SIGTERM)
            for process in cluster.processes:
                process.wait(timeout=60)
            for i in range(len(cluster.addresses)):
                await asyncio.to_thread(cluster.start, i)
            await wait_for_coverage(cluster.addresses[0], len(cluster.addresses), 240)
            await ask(client, hello, 8, False)
            after = await ask(client, asks[0], tokens, True)
            uncached = await ask(client, asks[0], tokens, False)
            return Restarted(cold, after, uncached, (before, await _spans(cluster)))
        finally:
            cluster.stop()


def print_restart(runs: Sequence[Restarted]) -> None:
    print(f"{'':26}{'prompt':>8}{'cached':>8}{'TTFT ms':>9}")
    for name, pick in (
        ("request 1, cold", lambda r: r.cold),
        ("after the restart", lambda r: r.after),
        ("after, without the cache", lambda r: r.uncached),
    ):
        last = pick(runs[-1])
        ttft = statistics.median(pick(r).ttft_s for r in runs) * 1000
        print(f"{name:26}{last.prompt_tokens:8}{last.cached_tokens:8}{ttft:9.0f}")
    of_cold = statistics.median(r.after.ttft_s / r.cold.ttft_s for r in runs)
    of_uncached = statistics.median(r.after.ttft_s / r.uncached.ttft_s for r in runs)
    print(f"after the restart / cold: {of_cold:.1%} (target: at most 25%); ", end="")
    print(f"/ without the cache after it: {of_uncached:.1%}")
    for r, run in enumerate(runs):
        print(f"round {r + 1} spans before {run.spans[0]}, after {run.spans[1]}")
        if run.after.text != run.cold.text or run.uncached.text != run.cold.text:
            print(f"FINDING: round {r + 1}: request 1's text differs across the restart")


def mismatches(rounds: Sequence[Sides], label: str) -> list[str]:
    """Where an answer with the cache is not the text without it, with the first difference."""
    found = []
    for r, sides in enumerate(rounds):
        for i, (on, off) in enumerate(zip(sides[True], sides[False], strict=True)):
            if on is not None and off is not None and on.text != off.text:
                at = _first_difference(on.text, off.text)
                found.append(
                    f"round {r + 1} {label} {i + 1}: differ from character {at}: "
                    f"on {on.text[at : at + 40]!r}, off {off.text[at : at + 40]!r}"
                )
    return found


def _first_difference(a: str, b: str) -> int:
    return next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )


def oddities(rounds: Sequence[Sides], label: str) -> list[str]:
    """What makes a figure mean something else: cached tokens without the cache, a request
    the entry re-routed and replayed whole, a route whose spans moved since the last one."""
    found = []
    for r, sides in enumerate(rounds):
        for cache in BOTH:
            side = "on" if cache else "off"
            before: Answer | None = None
            for i, a in enumerate(sides[cache]):
                if a is None:
                    continue
                where = f"round {r + 1} {label} {i + 1} ({side})"
                if a.cached_tokens and not cache:
                    found.append(f"{where}: {a.cached_tokens} cached without the cache")
                found += [f"{where}: re-routed and replayed: {why}" for why in a.reroutes]
                if a.refused:
                    found.append(f"{where}: {len(a.refused)} x 503 first: {a.refused[0]}")
                if before is not None and a.route != before.route:
                    found.append(f"{where}: the route's spans moved, {before.route} -> {a.route}")
                before = a
    return found


def print_conversation(rounds: Sequence[Sides]) -> None:
    last = rounds[-1]
    print(
        f"{'turn':>4}{'prompt':>8}{'cached':>8}{'TTFT off ms':>13}{'TTFT on ms':>12}{'on/off':>8}"
    )
    for i in range(len(last[True])):
        on = statistics.median(_asked(s[True][i]).ttft_s for s in rounds) * 1000
        a = _asked(last[True][i])
        print(f"{i + 1:4}{a.prompt_tokens:8}{a.cached_tokens:8}", end="")
        if last[False][i] is None:
            print(f"{'-':>13}{on:12.0f}{'-':>8}")
            continue
        off = statistics.median(_asked(s[False][i]).ttft_s for s in rounds) * 1000
        print(f"{off:13.0f}{on:12.0f}{on / off:8.2f}")
    for cache, name in ((False, "without the cache"), (True, "with the cache")):
        growth = statistics.median(
            _asked(s[cache][-1]).ttft_s / _asked(s[cache][0]).ttft_s for s in rounds
        )
        print(f"TTFT(turn {len(last[True])}) / TTFT(turn 1), {name}: {growth:.2f}x", end="")
        print("  (target: at most 1.3x)" if cache else "")
    middle = [i for i, a in enumerate(last[False]) if a is not None][1:-1]
    for i in middle:
        on = statistics.median(
            _asked(s[True][i]).ttft_s / _asked(s[True][0]).ttft_s for s in rounds
        )
        print(f"TTFT(turn {i + 1}) / TTFT(turn 1), with the cache: {on:.2f}x")


def _asked(answer: Answer | None) -> Answer:
    if answer is None:
        raise ValueError("that side was not asked this turn")
    return answer


def print_agent(rounds: Sequence[Sides]) -> None:
    asked = [{cache: [_asked(a) for a in s[cache]] for cache in BOTH} for s in rounds]
    last = asked[-1]
    later = last[True][1:]
    print(f"prompt tokens {last[True][0].prompt_tokens} (request 1), ", end="")
    print(f"{min(a.prompt_tokens for a in later)}-{max(a.prompt_tokens for a in later)} (the rest)")
    print(f"cached tokens with the cache: {last[True][0].cached_tokens} (request 1), ", end="")
    print(f"{min(a.cached_tokens for a in later)}-{max(a.cached_tokens for a in later)} (the rest)")
    print(f"{'':18}{'request 1 ms':>14}{'rest: median':>14}{'max':>8}   (of request 1)")
    for cache, name in ((False, "without the cache"), (True, "with the cache")):
        first = statistics.median(s[cache][0].ttft_s for s in asked)
        fractions = [a.ttft_s / s[cache][0].ttft_s for s in asked for a in s[cache][1:]]
        print(f"{name:18}{first * 1000:14.0f}{statistics.median(fractions):14.1%}", end="")
        print(f"{max(fractions):8.1%}" + ("   (target: at most 15%)" if cache else ""))


def report(rounds: Sequence[Sides], label: str) -> None:
    differ = mismatches(rounds, label)
    if not differ:
        print("texts: every answer with the cache is the same as the one without it")
    for line in [*differ, *oddities(rounds, label)]:
        print(f"FINDING: {line}")


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--turns", type=int, default=len(CHAT_TURNS))
    parser.add_argument("--requests", type=int, default=len(AGENT_REQUESTS))
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--max-tokens", type=int, default=56, help="per conversation answer")
    parser.add_argument("--agent-max-tokens", type=int, default=16, help="per agent answer")
    parser.add_argument("--parts", default="conversation,agent")
    parser.add_argument(
        "--rebalance-threshold",
        type=float,
        help="placement.rebalance_threshold of the nodes (default: the product's); blocks "
        "are kept per span, so a re-plan mid-run empties the moved nodes' caches",
    )
    parser.add_argument("--chunk-tokens", type=int, help="runtime.prefill_chunk_tokens")
    parser.add_argument(
        "--model",
        help="a GGUF path (e.g. python -m bench.fixture_7b's) instead of the embedded model",
    )
    parser.add_argument(
        "--off-turns",
        help="the conversation's turns asked without the cache too, e.g. 1,5,10 (default: "
        "all, each side with its own history; given, both sides share the cached side's)",
    )
    args = parser.parse_args()
    if not 2 <= args.turns <= len(CHAT_TURNS):
        parser.error(f"--turns takes 2 to {len(CHAT_TURNS)}")
    if not 2 <= args.requests <= len(AGENT_REQUESTS):
        parser.error(f"--requests takes 2 to {len(AGENT_REQUESTS)}")
    parts = set(args.parts.split(","))
    if not parts <= {"conversation", "agent", "restart"}:
        parser.error("--parts takes conversation, agent and restart")
    runtime = RuntimeConfig(cache_dir=MODEL_CACHE, threads=1)
    if args.model:
        runtime = dataclasses.replace(runtime, model=args.model)
    off_turns = None
    if args.off_turns:
        off_turns = frozenset(int(t) for t in args.off_turns.split(","))
        if not {1, args.turns} <= off_turns <= set(range(1, args.turns + 1)):
            parser.error(
                "--off-turns takes turns of the conversation, the first and last among them"
            )
    tools = "\n".join(json.dumps(t, indent=2) for t in AGENT_TOOLS)
    days = [FIRST_DAY + datetime.timedelta(days=r) for r in range(args.repeats)]
    config = ""
    if args.rebalance_threshold is not None:
        config += f"[placement]\nrebalance_threshold = {args.rebalance_threshold}\n"
    if args.chunk_tokens is not None:
        config += f"[runtime]\nprefill_chunk_tokens = {args.chunk_tokens}\n"
    if "restart" in parts:
        # its own nodes, stopped and started again: before the others, which share theirs
        with tempfile.TemporaryDirectory() as folder:
            flags = split_flags(runtime, 3)
            if config:
                (Path(folder) / "bootstrap.toml").write_text(config)
                flags += ["--config", str(Path(folder) / "bootstrap.toml")]
            restarts = [
                await agent_restart(
                    runtime,
                    flags,
                    AGENT_SYSTEM.format(date=day.isoformat(), tools=tools),
                    AGENT_REQUESTS[:3],
                    args.agent_max_tokens,
                )
                for day in days
            ]
        print("\nagent restart: 3 node processes, request 1, two more, every node stopped")
        print("(SIGTERM) and started again, request 1 again with the cache and without")
        print_restart(restarts)
    if not parts & {"conversation", "agent"}:
        return
    async with split_swarm(runtime, 3, config) as client:
        # the first request of a fresh swarm pays for its set-up; a short prompt keeps no block
        await ask(client, [{"role": "user", "content": "Hello!"}], 8, False)
        print("3 node processes on loopback, one torch thread each, greedy; TTFT streamed, ")
        if config:
            print("bootstrap.toml: " + config.replace("\n", " "))
        print(f"client side; each request both ways back to back; {args.repeats} round(s)")
        if "conversation" in parts:
            chats = [
                await conversation(
                    client,
                    CHAT_SYSTEM.format(date=f"{day:%A} {day.day} {day:%B %Y}"),
                    CHAT_TURNS[: args.turns],
                    args.max_tokens,
                    off_turns,
                )
                for day in days
            ]
            print(f"\nconversation: {args.turns} turns, answers of up to {args.max_tokens} tokens")
            print_conversation(chats)
            report(chats, "turn")
        if "agent" in parts:
            loops = [
                await agent_loop(
                    client,
                    AGENT_SYSTEM.format(date=day.isoformat(), tools=tools),
                    AGENT_REQUESTS[: args.requests],
                    args.agent_max_tokens,
                )
                for day in days
            ]
            print(f"\nagent loop: {args.requests} requests, answers of up to ", end="")
            print(f"{args.agent_max_tokens} tokens")
            print_agent(loops)
            report(loops, "request")


if __name__ == "__main__":
    asyncio.run(main())

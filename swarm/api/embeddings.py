"""OpenAI's POST /v1/embeddings and Ollama's /api/embed and older /api/embeddings: the body
read (`embedding_fields`), the vectors computed by the backend under the guard's slot, the
answer in each API's shape."""

from __future__ import annotations

import time

from aiohttp import web

from swarm.api.answers import Answers
from swarm.api.embedding_fields import openai_answer, parse_ollama, parse_ollama_old, parse_openai

_NS = 1_000_000_000


class EmbeddingHandlers:
    def __init__(self, answers: Answers) -> None:
        self.answers = answers

    async def openai(self, http: web.Request) -> web.Response:
        parsed = parse_openai(await self.answers.body(http), self.answers.backend)
        done = await self.answers.embeddings(parsed.request, "embeddings")
        return web.json_response(openai_answer(parsed, done))

    async def ollama(self, http: web.Request) -> web.Response:
        started = time.perf_counter()
        parsed = parse_ollama(await self.answers.body(http), self.answers.backend)
        done = await self.answers.embeddings(parsed.request, "ollama_embed")
        return web.json_response(
            {
                "model": parsed.model,
                "embeddings": done.vectors,
                "total_duration": int((time.perf_counter() - started) * _NS),
                "load_duration": 0,  # the model is always loaded
                "prompt_eval_count": done.prompt_tokens,
            }
        )

    async def ollama_old(self, http: web.Request) -> web.Response:
        parsed = parse_ollama_old(await self.answers.body(http), self.answers.backend)
        done = await self.answers.embeddings(parsed.request, "ollama_embeddings")
        return web.json_response({"embedding": done.vectors[0]})

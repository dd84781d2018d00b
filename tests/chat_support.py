"""A loopback stand-in for OpenAI's ``POST /v1/chat/completions`` (the
``openai`` brain backend's one endpoint): a real HTTP server on 127.0.0.1
that records each request and answers as the test says."""

from __future__ import annotations

from typing import Any, Awaitable, Callable

import trio
from hypercorn.config import Config as HyperConfig
from hypercorn.trio import serve
from quart import request
from quart_trio import QuartTrio

#: How a test answers one request: its JSON body → (status, body).
Answer = Callable[[dict[str, Any]], Awaitable[tuple[int, Any]]]


def chat_app(answer: Answer, seen: list[dict[str, Any]]) -> QuartTrio:
    """The stand-in: each request recorded in ``seen`` (its ``Authorization``
    and body), answered by ``answer``."""
    app = QuartTrio("chat-standin")

    @app.post("/v1/chat/completions")
    async def completions() -> Any:
        body = await request.get_json()
        seen.append({"auth": request.headers.get("Authorization"), "body": body})
        status, reply = await answer(body)
        return reply, status

    return app


def in_turn(answers: list[tuple[int, Any]]) -> Answer:
    """An ``Answer`` giving ``answers`` one after the other."""
    async def answer(_body: dict[str, Any]) -> tuple[int, Any]:
        return answers.pop(0)
    return answer


async def serve_chat(nursery: trio.Nursery, app: QuartTrio) -> str:
    """Serve ``app`` on a free loopback port; its OpenAI base URL."""
    config = HyperConfig()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = config.errorlog = None
    binds = await nursery.start(lambda task_status: serve(app, config, task_status=task_status))
    return str(binds[0]) + "/v1"


def completion(content: str) -> dict[str, Any]:
    """A Chat Completions answer whose one choice says ``content``."""
    return {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "gpt-5-mini",
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": content}}]}


def summarising(summary_prompt: str, instruction: str = "You are sol, briefly.") -> Answer:
    """An ``Answer`` for a brain that also summarises calls: to a request
    whose system message is ``summary_prompt``, "The earlier call, in short:"
    and the transcript's last line (so a test sees the transcript reached the
    model and the summary its destination); to any other, ``instruction`` in
    the brain's wrapper."""
    async def answer(body: dict[str, Any]) -> tuple[int, Any]:
        messages = body.get("messages") or [{}]
        if messages[0].get("content") == summary_prompt:
            last = str(messages[-1].get("content", "")).strip().splitlines()[-1]
            return 200, completion(f"The earlier call, in short: {last}")
        return 200, completion(f"<voice_instruction>{instruction}</voice_instruction>")
    return answer

"""Language models behind one small interface: the offline ``directive`` model and OpenAI-compatible servers.

A model's ``stream(messages, tools)`` yields ``TextDelta``, ``ModelToolCall`` and finally one ``ModelFinish``;
it raises ``ModelError`` (code ``server_error`` or ``rate_limit_exceeded``) when the call fails.
Messages are dicts: ``{role, content, tool_calls?, tool_call_id?, tool_name?, tool_status?}``.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from agentrun.engine.inputs import decode_model_args
from agentrun.engine.tools import Tool


@dataclass
class TextDelta:
    text: str


@dataclass
class ModelToolCall:
    id: str
    name: str
    args: Any  # a dict, or the raw string the model produced (validated by the tool)


@dataclass
class ModelFinish:
    usage: dict = field(default_factory=lambda: usage_dict(0, 0))
    finish_reason: str = "stop"


ModelEvent = TextDelta | ModelToolCall | ModelFinish


class ModelError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class LanguageModel(Protocol):
    name: str

    def stream(self, messages: list[dict], tools: list[Tool]) -> AsyncIterator[ModelEvent]: ...


def usage_dict(prompt: int, completion: int) -> dict:
    return {"promptTokens": prompt, "completionTokens": completion, "totalTokens": prompt + completion}


def _words(text: str) -> int:
    return len(text.split())


TOOL_LINE = re.compile(r"^\s*/tool\s+(\S+)\s*(.*)$")
FAIL_LINE = re.compile(r"^\s*/fail\s+(\S+)")
SLEEP_LINE = re.compile(r"^\s*/sleep\s+(\d+(?:\.\d+)?)")
SAY_LINE = re.compile(r"^\s*/say\s+(.*\S)")
CONTINUATION_PREFIX = "Background tasks finished:"


def result_line(message: dict) -> str:
    """``<tool-id>: <result JSON>``, ``<tool-id>: denied: <reason>`` or ``<tool-id>: error: <message>``."""
    name = message.get("tool_name") or ""
    status = message.get("tool_status")
    if status == "denied":
        return f"{name}: denied: {message['content']}"
    if status == "error":
        return f"{name}: error: {message['content']}"
    return f"{name}: {message['content']}"


class DirectiveModel:
    """Deterministic offline model (docs/runs.md#the-offline-model): it obeys directives in the last user message."""

    name = "directive"

    async def stream(self, messages: list[dict], tools: list[Tool]) -> AsyncIterator[ModelEvent]:
        last_user = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=None)
        text = messages[last_user]["content"] if last_user is not None else ""
        after = messages[last_user + 1 :] if last_user is not None else []
        lines = text.splitlines()
        prompt_words = _words(text)

        for line in lines:
            if m := SLEEP_LINE.match(line):
                await asyncio.sleep(float(m.group(1)) / 1000)
        for line in lines:
            if m := FAIL_LINE.match(line):
                code = m.group(1) if m.group(1) in {"server_error", "rate_limit_exceeded"} else "server_error"
                raise ModelError(code, f"The model call failed ({code}), as directed.")

        # A continuation turn after background tasks names the finished calls in a system message.
        continuation = next(
            (m for m in reversed(after) if m["role"] == "system" and m["content"].startswith(CONTINUATION_PREFIX)),
            None,
        )
        results = {m["tool_call_id"]: m for m in after if m["role"] == "tool"}
        if continuation is not None:
            ids = continuation["content"][len(CONTINUATION_PREFIX) :].split()
            answer = "\n".join(result_line(results[i]) for i in ids if i in results)
            async for event in self._say(answer, prompt_words):
                yield event
            return

        tool_lines = [m for line in lines if (m := TOOL_LINE.match(line))]
        # What the agent says in its own words (``/say <sentence>``): before its tool calls, as a model
        # explains what it is about to do; without calls, that is its answer.
        said = "\n".join(m.group(1) for line in lines if (m := SAY_LINE.match(line)))
        calls = [c for m in after if m["role"] == "assistant" for c in (m.get("tool_calls") or [])]
        if tool_lines and not calls:
            for piece in re.findall(r"\s*\S+", said):
                yield TextDelta(piece)
            for m in tool_lines:
                args = decode_model_args(m.group(2).strip() or "{}")
                yield ModelToolCall(id=f"call_{uuid.uuid4().hex[:24]}", name=m.group(1), args=args)
            out = _words(said) + sum(_words(m.group(0)) for m in tool_lines)
            yield ModelFinish(usage_dict(prompt_words, out), "tool-calls")
            return
        if calls:
            answer = "\n".join(result_line(results[c["id"]]) for c in calls if c["id"] in results)
        elif said:
            answer = said
        else:
            answer = f"Echo: {text.strip()}"
        async for event in self._say(answer, prompt_words):
            yield event

    async def _say(self, answer: str, prompt_words: int) -> AsyncIterator[ModelEvent]:
        # One delta per word, each carrying the white space before it: the deltas join to the answer.
        for piece in re.findall(r"\s*\S+", answer):
            yield TextDelta(piece)
        yield ModelFinish(usage_dict(prompt_words, _words(answer)), "stop")


class OpenAIChatModel:
    """Any OpenAI-compatible chat completions server (OpenAI, Azure OpenAI, Ollama, vLLM, LM Studio)."""

    def __init__(self, model: str, *, api_key: str | None = None, base_url: str | None = None) -> None:
        self.name = f"openai:{model}"
        self.model = model
        self.api_key = api_key
        self.base_url = base_url

    def _client(self) -> Any:
        import openai

        return openai.AsyncOpenAI(
            api_key=self.api_key or os.environ.get("OPENAI_API_KEY") or "not-needed",
            base_url=self.base_url or os.environ.get("OPENAI_BASE_URL") or None,
            max_retries=0,
        )

    @staticmethod
    def to_openai_messages(messages: list[dict]) -> list[dict]:
        answered = {m["tool_call_id"] for m in messages if m["role"] == "tool"}
        out: list[dict] = []
        for m in messages:
            if m["role"] == "assistant" and m.get("tool_calls"):
                # Calls still waiting for a person have no result yet; the API refuses unanswered calls.
                calls = [c for c in m["tool_calls"] if c["id"] in answered]
                entry: dict = {"role": "assistant", "content": m["content"] or None}
                if calls:
                    entry["tool_calls"] = [
                        {
                            "id": c["id"],
                            "type": "function",
                            "function": {
                                "name": c["name"],
                                "arguments": c["args"] if isinstance(c["args"], str) else json.dumps(c["args"]),
                            },
                        }
                        for c in calls
                    ]
                if entry["content"] or calls:
                    out.append(entry)
            elif m["role"] == "tool":
                content = m["content"] if m.get("tool_status") != "denied" else f"denied: {m['content']}"
                out.append({"role": "tool", "tool_call_id": m["tool_call_id"], "content": content})
            else:
                out.append({"role": m["role"], "content": m["content"]})
        return out

    async def stream(self, messages: list[dict], tools: list[Tool]) -> AsyncIterator[ModelEvent]:
        import openai

        kwargs: dict[str, Any] = {
            "model": self.model,
            "messages": self.to_openai_messages(messages),
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if tools:
            kwargs["tools"] = [
                {
                    "type": "function",
                    "function": {"name": t.id, "description": t.description, "parameters": t.parameters_schema},
                }
                for t in tools
            ]
        partial: dict[int, dict] = {}
        usage = usage_dict(0, 0)
        finish_reason = "stop"
        try:
            response = await self._client().chat.completions.create(**kwargs)
            async for event in response:
                if event.usage:
                    usage = usage_dict(event.usage.prompt_tokens or 0, event.usage.completion_tokens or 0)
                for choice in event.choices or []:
                    delta = choice.delta
                    if delta is not None and delta.content:
                        yield TextDelta(delta.content)
                    for tc in (delta.tool_calls if delta is not None else None) or []:
                        slot = partial.setdefault(tc.index, {"id": None, "name": "", "args": ""})
                        if tc.id:
                            slot["id"] = tc.id
                        if tc.function is not None:
                            slot["name"] += tc.function.name or ""
                            slot["args"] += tc.function.arguments or ""
                    if choice.finish_reason:
                        finish_reason = choice.finish_reason
        except openai.RateLimitError as exc:
            raise ModelError("rate_limit_exceeded", str(exc)) from exc
        except openai.OpenAIError as exc:
            raise ModelError("server_error", str(exc)) from exc
        for index in sorted(partial):
            slot = partial[index]
            yield ModelToolCall(id=slot["id"] or f"call_{uuid.uuid4().hex[:24]}", name=slot["name"], args=slot["args"])
        yield ModelFinish(usage, "tool-calls" if partial else ("length" if finish_reason == "length" else "stop"))


def get_model(spec: str | LanguageModel | None) -> LanguageModel:
    """``directive`` or ``openai:<model>``; None reads the AGENTRUN_MODEL setting."""
    if spec is not None and not isinstance(spec, str):
        return spec
    if spec is None:
        from django.conf import settings

        spec = settings.AGENTRUN_MODEL
    if spec in ("", "directive"):
        return DirectiveModel()
    if spec.startswith("openai:"):
        return OpenAIChatModel(spec.removeprefix("openai:"))
    raise ValueError(f"unknown model {spec!r}: use 'directive' or 'openai:<model>'")

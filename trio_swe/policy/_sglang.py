"""SGLang's native ``/generate`` as a :class:`~trio_swe.policy.Policy` (token ids in and out)."""

from __future__ import annotations

import math
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from operator import attrgetter
from typing import Any

import httpx
import msgspec
import trio

from .._errors import PolicyError
from ._http import HttpPolicy, IdsBody
from ._types import PolicyOutput

__all__ = ["SGLangPolicy", "decode_generate_reply"]


# The reply is decoded into exactly what PolicyOutput holds. ``output_ids`` comes as the list
# the tokenizer and the agent need (msgspec builds it directly); each ``output_token_logprobs``
# entry ``[logprob, token_id, text]`` is decoded as a one-field array-like struct, so its id and
# text are parsed but never become objects (the cheapest of the shapes tried; figures against
# slime's adapter in ``python -m bench trajectory``). A reply without ``output_ids`` (older
# servers) is decoded again with the entries' ids.


class _LogprobOnly(msgspec.Struct, array_like=True, gc=False):
    logprob: float | None


class _LogprobEntry(msgspec.Struct, array_like=True, gc=False):
    logprob: float | None
    token_id: int


class _FinishReason(msgspec.Struct):
    type: str = "stop"


class _MetaInfo(msgspec.Struct):
    output_token_logprobs: list[_LogprobOnly] = []
    finish_reason: _FinishReason | None = None


class _GenerateReply(msgspec.Struct):
    meta_info: _MetaInfo
    output_ids: list[int] | None = None


class _MetaInfoWithIds(msgspec.Struct):
    output_token_logprobs: list[_LogprobEntry] = []


class _GenerateReplyWithIds(msgspec.Struct):
    meta_info: _MetaInfoWithIds


_decode_reply = msgspec.json.Decoder(_GenerateReply).decode
_decode_reply_ids = msgspec.json.Decoder(_GenerateReplyWithIds).decode
_logprob_of = attrgetter("logprob")
_token_id_of = attrgetter("token_id")


def decode_generate_reply(data: bytes) -> PolicyOutput:
    """A :class:`PolicyOutput` from the body of an SGLang ``/generate`` reply.

    A missing log-prob (``null``) becomes NaN.

    Raises:
        PolicyError: the body is not a reply, or its ``output_ids`` and
            ``output_token_logprobs`` differ in length.
    """
    try:
        reply = _decode_reply(data)
        entries = reply.meta_info.output_token_logprobs
        output_ids = reply.output_ids
        if output_ids is None:
            output_ids = list(
                map(_token_id_of, _decode_reply_ids(data).meta_info.output_token_logprobs)
            )
    except msgspec.DecodeError as exc:
        raise PolicyError(f"policy /generate sent a malformed reply: {exc}") from exc
    if len(output_ids) != len(entries):
        raise PolicyError(
            f"policy reply: {len(output_ids)} output_ids but {len(entries)} output_token_logprobs"
        )
    log_probs: list[Any] = list(map(_logprob_of, entries))
    try:
        sum(log_probs)  # raises on a None; cheaper than `None in log_probs` (float == None)
    except TypeError:
        log_probs = [math.nan if x is None else x for x in log_probs]
    finish = reply.meta_info.finish_reason
    return PolicyOutput(
        output_ids=output_ids,
        log_probs=log_probs,
        finish_reason=finish.type if finish is not None else "stop",
    )


class _StreamMeta(msgspec.Struct):
    output_token_logprobs: list[_LogprobEntry] = []
    finish_reason: _FinishReason | None = None
    completion_tokens: int | None = None


class _StreamChunk(msgspec.Struct):
    meta_info: _StreamMeta


_decode_chunk = msgspec.json.Decoder(_StreamChunk).decode

#: Bound on the shielded ``/abort_request`` sent when a generation is cancelled.
ABORT_TIMEOUT_SEC = 5.0


class SGLangPolicy(HttpPolicy):
    """A :class:`Policy` that calls SGLang's native ``/generate`` endpoint with token ids.

    It sends ``input_ids``, ``sampling_params`` and ``return_logprob: true`` and reads the sampled
    ids and their log-probs from ``meta_info.output_token_logprobs``. Cancelling a call aborts the
    request on the server (``/abort_request`` with the request's ``rid``), so no orphaned
    generation keeps a GPU busy. The routing key travels in ``X-SMG-Routing-Key``.

    Use as an async context manager, or call :meth:`aclose`::

        async with SGLangPolicy("http://127.0.0.1:30000") as policy:
            out = await policy.generate(ids, {"max_new_tokens": 512, "temperature": 1.0})
    """

    def __init__(
        self,
        base_url: str,
        *,
        client: httpx.AsyncClient | None = None,
        read_timeout_sec: float | None = None,
        headers: Mapping[str, str] | None = None,
        defaults: Mapping[str, Any] | None = None,
    ) -> None:
        """Create the client.

        Args:
            base_url: the server, e.g. ``http://127.0.0.1:30000``.
            client: an httpx client to share; one is created (and closed by :meth:`aclose`)
                otherwise.
            read_timeout_sec: bound on one generation; ``None`` waits as long as the caller's
                cancel scope allows (the episode's budget), which is the trio way.
            headers: extra headers of every request (e.g. authorization).
            defaults: sampling parameters under each call's own.
        """
        super().__init__(
            base_url,
            client=client,
            read_timeout_sec=read_timeout_sec,
            headers=headers or {},
            defaults=defaults,
        )

    async def generate(
        self,
        input_ids: Sequence[int],
        sampling_params: Mapping[str, Any],
        *,
        session_id: str | None = None,
    ) -> PolicyOutput:
        """See :meth:`Policy.generate`."""
        rid = uuid.uuid4().hex
        fields = {
            "rid": rid,
            "sampling_params": {**self.defaults, **sampling_params},
            "return_logprob": True,
        }
        body = IdsBody(fields, "input_ids", input_ids)
        headers = {**self._headers, **body.headers}
        if session_id:
            headers["X-SMG-Routing-Key"] = session_id
        self._stats["requests"] += 1
        try:
            response = await self._client.post(
                f"{self.base_url}/generate", content=body, headers=headers
            )
        except trio.Cancelled:
            await self._abort(rid)
            raise
        except httpx.HTTPError as exc:
            self._stats["errors"] += 1
            await self._abort(rid)
            raise PolicyError(f"policy /generate failed: {type(exc).__name__}: {exc}") from exc
        if response.status_code >= 400:
            self._stats["errors"] += 1
            raise PolicyError(
                f"policy /generate answered HTTP {response.status_code}: {response.text[:300]}"
            )
        try:
            out = decode_generate_reply(response.content)
        except PolicyError:
            self._stats["errors"] += 1
            raise
        self._stats["output_tokens"] += len(out.output_ids)
        return out

    async def generate_stream(
        self,
        input_ids: Sequence[int],
        sampling_params: Mapping[str, Any],
        *,
        on_tokens: Callable[[list[int]], Awaitable[None]],
        session_id: str | None = None,
    ) -> PolicyOutput:
        """See :meth:`StreamingPolicy.generate_stream`: ``/generate`` with ``stream: true``.

        SGLang streams server-sent events (``data: {...}``, ``data: [DONE]``) whose
        ``meta_info.output_token_logprobs`` hold the output so far (its default) or only the
        new part (``--incremental-streaming-output``); ``completion_tokens`` tells them apart.
        A cancelled or failed stream is aborted on the server.
        """
        rid = uuid.uuid4().hex
        fields = {
            "rid": rid,
            "sampling_params": {**self.defaults, **sampling_params},
            "return_logprob": True,
            "stream": True,
        }
        body = IdsBody(fields, "input_ids", input_ids)
        headers = {**self._headers, **body.headers}
        if session_id:
            headers["X-SMG-Routing-Key"] = session_id
        self._stats["requests"] += 1
        ids: list[int] = []
        log_probs: list[float] = []
        finish = "stop"
        done = False
        try:
            async with self._client.stream(
                "POST",
                f"{self.base_url}/generate",
                content=body,
                headers=headers,
            ) as response:
                if response.status_code >= 400:
                    text = (await response.aread())[:300].decode(errors="replace")
                    self._stats["errors"] += 1
                    done = True  # the server answered: nothing to abort
                    raise PolicyError(
                        f"policy /generate answered HTTP {response.status_code}: {text}"
                    )
                async for line in response.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    try:
                        meta = _decode_chunk(data).meta_info
                    except msgspec.DecodeError as exc:
                        self._stats["errors"] += 1
                        raise PolicyError(
                            f"policy /generate streamed a malformed chunk: {exc}"
                        ) from exc
                    entries = meta.output_token_logprobs
                    total = meta.completion_tokens
                    if total is None or len(entries) != total - len(ids):
                        entries = entries[len(ids) :]  # cumulative: the output so far
                    if meta.finish_reason is not None:
                        finish = meta.finish_reason.type
                    if entries:
                        new = [e.token_id for e in entries]
                        ids.extend(new)
                        log_probs.extend(
                            e.logprob if e.logprob is not None else math.nan for e in entries
                        )
                        await on_tokens(new)
                done = True
        except httpx.HTTPError as exc:
            self._stats["errors"] += 1
            await self._abort(rid)
            raise PolicyError(f"policy /generate failed: {type(exc).__name__}: {exc}") from exc
        except BaseException:
            if not done:
                await self._abort(rid)
            raise
        self._stats["output_tokens"] += len(ids)
        return PolicyOutput(output_ids=ids, log_probs=log_probs, finish_reason=finish)

    async def _abort(self, rid: str) -> None:
        # Shielded and bounded: we are usually being cancelled ourselves.
        self._stats["aborts"] += 1
        with trio.CancelScope(shield=True), trio.move_on_after(ABORT_TIMEOUT_SEC):
            try:
                await self._client.post(
                    f"{self.base_url}/abort_request",
                    content=msgspec.json.encode({"rid": rid}),
                    headers=self._headers,
                )
            except httpx.HTTPError:
                pass

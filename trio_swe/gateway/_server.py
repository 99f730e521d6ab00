"""The gateway's HTTP edge: hypercorn on trio serving the three APIs for per-episode sessions.

Thin I/O around the sans-IO parts: read the body (capped), find the session by its key, parse
the request with the API's module, place it on the session, call the policy while watching for
the client to go away (which cancels the call: :class:`~trio_swe.agents.SGLangPolicy` then sends
``/abort_request``), send the reply as JSON or SSE, and record the turn once it was sent.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import json
import logging
import os
import secrets
import socket as _socket
import threading
import weakref
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Mapping,
    MutableMapping,
    Sequence,
)
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import msgspec
import trio

from .._errors import ConfigError, InvalidArgumentError, TokenLimitError
from .._groups import open_private_nursery
from .._lru import Lru
from ..models import ChatModel
from ..policy import Policy, PolicyError, PolicyOutput
from ..trajectory import TurnRecord
from . import _anthropic, _chat, _responses
from ._common import ApiError, Conversation, Reply, new_ref
from ._session import Session, SessionStatistics
from ._stream import Delta, OutputStream

__all__ = ["Gateway", "GatewaySession", "GatewayStatistics", "open_gateway"]

logger = logging.getLogger("trio_swe.gateway")

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

#: Default bound of the chat models cached by tool list, in bytes of the lists' JSON.
DEFAULT_TOOL_CACHE_BYTES = 8 * 1024 * 1024

#: Default cap of a request body (Claude Code's requests are ~13-80 KB; a full 128k-token
#: context is ~0.6 MB of JSON). A body is parsed on the event loop (the JSON decoder holds the
#: GIL whatever thread runs it), so its size is also how long it may stall the other sessions.
DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024

#: Default cap of any prompt, in tokens, besides a session's ``max_context_tokens``.
DEFAULT_MAX_PROMPT_TOKENS = 1 << 20

#: A request whose body is at least this big tokenizes on at most ``tokenizer_threads - 1``
#: threads, so small requests of other sessions always find one.
BIG_REQUEST_BYTES = 256 * 1024
#: A request that rendered at least this many tokens (or failed before it knew, with a body of
#: ``BIG_REQUEST_BYTES`` or more) hands the heap's free memory back to the system: once its
#: prompt is built (before the policy call), or once done.
#: A long history resent whole is a big body that renders a few hundred new tokens: its
#: transient memory is small, and a trim per request would cost it ~0.3 ms for nothing.
BIG_RENDER_TOKENS = BIG_REQUEST_BYTES // 4


class GatewayStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """Counters of a gateway.

    Attributes:
        requests: HTTP requests received.
        by_status: responses by HTTP status.
        sessions_open: sessions open now.
        sessions_total: sessions opened.
        policy_calls: calls to the policy.
        policy_errors: calls that failed.
        disconnects: requests whose client went away before the reply (policy call cancelled).
        chat_models: chat models built (one per distinct tool list, cached).
        chat_models_cached: chat models in the cache now.
        chat_models_cached_bytes: the JSON bytes of their tool lists (``tool_cache_bytes``
            bounds it).
        heap_trims: times the heap's free memory went back to the system for a request
            with a body of ``BIG_REQUEST_BYTES`` or more: before its prompt is built when its
            new messages hold that much text, after it when it rendered
            ``BIG_RENDER_TOKENS`` or more (before the policy call), or once done when it
            failed before it knew.
    """

    requests: int
    by_status: dict[int, int]
    sessions_open: int
    sessions_total: int
    policy_calls: int
    policy_errors: int
    disconnects: int
    chat_models: int
    chat_models_cached: int = 0
    chat_models_cached_bytes: int = 0
    heap_trims: int = 0


class GatewaySession:
    """One episode's session on a gateway; from :meth:`Gateway.open_session`.

    Attributes:
        session_id: the episode's id (the policy's routing key).
        api_key: the secret the agent presents (API key or bearer token); it names the session.
    """

    def __init__(self, gateway: Gateway, session: Session, api_key: str) -> None:
        self._gateway = gateway
        self.session = session
        self.session_id = session.session_id
        self.api_key = api_key
        self.finished = False
        #: One request of the session renders and tokenizes at a time: one agent's burst of
        #: big prompts holds at most one tokenizing thread.
        self.tokenizing = trio.Lock()
        self._trim_on_drop = False
        self._inflight: set[trio.CancelScope] = set()
        self._idle = trio.Event()
        self._idle.set()

    def turns(self) -> list[TurnRecord]:
        """The episode's recorded turns (chain after chain; side chains excluded)."""
        return self.session.turns()

    def conversations(self) -> list[list[dict[str, Any]]]:
        """The episode's chains as template messages (see :meth:`Session.conversations`)."""
        return self.session.conversations()

    def tools(self) -> list[list[dict[str, Any]]]:
        """The tools of each of the episode's chains (see :meth:`Session.tools`)."""
        return self.session.tools()

    def statistics(self) -> SessionStatistics:
        """The session's counters."""
        return self.session.statistics()

    def finish(self) -> None:
        """End the session: later requests get 401; requests in flight are cancelled; the
        session's parse memo is dropped (its turns and statistics stay)."""
        if self.finished:
            return
        self.finished = True
        self.session.parse_memo.clear()
        for scope in list(self._inflight):
            scope.cancel()
        self._gateway._sessions.pop(self.api_key, None)


class Gateway:
    """A running gateway; from :func:`open_gateway`.

    Attributes:
        url: ``http://127.0.0.1:PORT`` when listening on TCP, else None.
        unix_socket: the path of its unix socket when listening on one, else None.
    """

    def __init__(
        self,
        policy: Policy,
        tokenizer: Any,
        *,
        tool_parser: str,
        template_kwargs: Mapping[str, Any] | None,
        model_name: str,
        max_body_bytes: int,
        max_sessions: int,
        tokenizer_threads: int = 2,
        stream_policy: bool = True,
        tool_cache_bytes: int = DEFAULT_TOOL_CACHE_BYTES,
        max_prompt_tokens: int = DEFAULT_MAX_PROMPT_TOKENS,
        keep_sampled: bool = True,
    ) -> None:
        self.policy = policy
        #: Stream the policy's output into SSE replies as it is generated (a policy with
        #: ``generate_stream``); otherwise each reply is sent once the output is complete.
        self.stream_policy = stream_policy
        self.tokenizer = tokenizer
        self.tool_parser = tool_parser
        self.template_kwargs = dict(template_kwargs or {})
        self.model_name = model_name
        self.max_body_bytes = max_body_bytes
        self.max_prompt_tokens = max_prompt_tokens
        self.keep_sampled = keep_sampled
        self.max_sessions = max_sessions
        self.url: str | None = None
        self.unix_socket: str | None = None
        self._sessions: dict[str, GatewaySession] = {}
        self._models: Lru[bytes, ChatModel] = Lru(64, max_bytes=tool_cache_bytes)
        self._models_lock = threading.Lock()  # chat_model() runs in tokenizing threads
        #: Rendering and tokenizing run in worker threads, at most this many at once (0: on
        #: the trio thread), so a long prompt never stalls the other sessions' streams.
        self.tokenizer_threads = tokenizer_threads
        self._limiter = trio.CapacityLimiter(max(tokenizer_threads, 1))
        self._big_limiter = trio.CapacityLimiter(max(tokenizer_threads - 1, 1))
        self._stats: dict[str, Any] = {
            "requests": 0,
            "sessions_total": 0,
            "policy_calls": 0,
            "policy_errors": 0,
            "disconnects": 0,
            "chat_models": 0,
            "heap_trims": 0,
        }
        self._by_status: dict[int, int] = {}

    # -- sessions ---------------------------------------------------------------------------

    def open_session(
        self,
        session_id: str,
        *,
        sampling_params: Mapping[str, Any] | None = None,
        max_context_tokens: int = 0,
        max_turns: int = 1000,
    ) -> GatewaySession:
        """Start a session; give the agent its :attr:`~GatewaySession.api_key`.

        Call :meth:`GatewaySession.finish` when the episode's agent is done (or use
        :meth:`session`).

        Raises:
            InvalidArgumentError: ``max_sessions`` sessions are open already.
        """
        if len(self._sessions) >= self.max_sessions:
            raise InvalidArgumentError(
                f"the gateway has {self.max_sessions} sessions open (max_sessions)"
            )
        key = f"sk-trio-swe-{secrets.token_hex(16)}"
        session = Session(
            session_id,
            model_for=self.chat_model,
            sampling_params=sampling_params,
            max_context_tokens=max_context_tokens,
            max_turns=max_turns,
            max_prompt_tokens=self.max_prompt_tokens,
            keep_sampled=self.keep_sampled,
        )
        handle = GatewaySession(self, session, key)
        self._sessions[key] = handle
        self._stats["sessions_total"] += 1
        return handle

    @asynccontextmanager
    async def session(
        self,
        session_id: str,
        *,
        sampling_params: Mapping[str, Any] | None = None,
        max_context_tokens: int = 0,
    ) -> AsyncIterator[GatewaySession]:
        """:meth:`open_session` for the block's duration, finished on the way out."""
        handle = self.open_session(
            session_id, sampling_params=sampling_params, max_context_tokens=max_context_tokens
        )
        try:
            yield handle
        finally:
            handle.finish()

    def chat_model(self, tools: Sequence[Mapping[str, Any]]) -> ChatModel:
        """The chat model for ``tools`` (built once per distinct list; the most recent kept,
        at most 64 and ``tool_cache_bytes`` of tool JSON).

        Raises:
            TemplateError: the chat template cannot render these tools.
        """
        text = json.dumps(tools, sort_keys=True).encode("utf-8", "surrogatepass")
        # Keyed by a digest: the key would otherwise hold a second copy of every list.
        key = hashlib.sha256(text).digest()
        with self._models_lock:
            model = self._models.get(key)
            if model is None:
                model = ChatModel(
                    self.tokenizer,
                    tools=tools,
                    tool_parser=self.tool_parser,
                    template_kwargs=self.template_kwargs,
                )
                # A model holds its tools as Python objects: ~2-3x their JSON; JSON bytes
                # bound it in proportion.
                self._models.put(key, model, nbytes=len(text))
                self._stats["chat_models"] += 1
            return model

    async def off_thread(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` in a tokenizing thread (see ``tokenizer_threads``)."""
        if not self.tokenizer_threads:
            return fn(*args)
        return await trio.to_thread.run_sync(fn, *args, limiter=self._limiter)

    async def tokenize(
        self, handle: GatewaySession, size: int, fn: Callable[..., Any], *args: Any
    ) -> Any:
        """``fn(*args)``, rendering and tokenizing a request of ``size`` bytes for ``handle``,
        admitted fairly: one at a time per session, and a big one (``BIG_REQUEST_BYTES``) only
        while another thread stays free for the small requests of other sessions."""
        if size >= BIG_REQUEST_BYTES and not handle._trim_on_drop:
            # What a session holds of big prompts goes when its owner drops it (after
            # reading its turns): give that memory back to the system then, too.
            handle._trim_on_drop = True
            weakref.finalize(handle.session, trim_memory)
        if not self.tokenizer_threads:
            return fn(*args)
        async with handle.tokenizing:
            if size < BIG_REQUEST_BYTES or self.tokenizer_threads < 2:
                return await self.off_thread(fn, *args)
            async with self._big_limiter:
                return await self.off_thread(fn, *args)

    def statistics(self) -> GatewayStatistics:
        """See :class:`GatewayStatistics`."""
        return GatewayStatistics(
            requests=self._stats["requests"],
            by_status=dict(self._by_status),
            sessions_open=len(self._sessions),
            sessions_total=self._stats["sessions_total"],
            policy_calls=self._stats["policy_calls"],
            policy_errors=self._stats["policy_errors"],
            disconnects=self._stats["disconnects"],
            chat_models=self._stats["chat_models"],
            chat_models_cached=len(self._models),
            chat_models_cached_bytes=self._models.nbytes,
            heap_trims=self._stats["heap_trims"],
        )

    # -- ASGI ----------------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        self._stats["requests"] += 1
        exchange = _Exchange(scope, receive, send, self)
        try:
            try:
                await exchange.handle()
            finally:
                if exchange.size >= BIG_REQUEST_BYTES and (
                    exchange.rendered is None
                    or (exchange.rendered >= BIG_RENDER_TOKENS and not exchange.trimmed_built)
                ):
                    # Failed before its prompt was built, or ended before the trim after the
                    # build (a trim before the build does not cover what the build made): what
                    # it parsed and tokenized is free now.
                    with trio.CancelScope(shield=True):
                        await exchange.trim()
        except ApiError as exc:
            await exchange.error(exc)
        except _ClientGone:
            self._stats["disconnects"] += 1
        except Exception as exc:  # a bug of ours: still an answer in the API's shape, logged
            logger.exception("gateway %s %s failed", exchange.method, exchange.path)
            try:
                await exchange.error(ApiError(500, "api_error", f"gateway error: {exc!r}"[:500]))
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                pass


class _ClientGone(Exception):
    pass


def _api_of(path: str) -> str:
    if "/messages" in path:
        return "anthropic"
    if path.endswith("/responses"):
        return "responses"
    return "chat"


_ROUTES: dict[str, str] = {
    "/v1/messages": "anthropic",
    "/messages": "anthropic",
    "/v1/responses": "responses",
    "/responses": "responses",
    "/v1/chat/completions": "chat",
    "/chat/completions": "chat",
}


class _Exchange:
    """One request/response."""

    def __init__(self, scope: Scope, receive: Receive, send: Send, gateway: Gateway) -> None:
        self.scope = scope
        self.receive = receive
        self._send = send
        self.gw = gateway
        self.method: str = scope["method"]
        self.path: str = scope["path"]
        self.api = _api_of(self.path)
        self.headers = {
            k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", ())
        }
        self.started = False
        #: The request body's size once read.
        self.size = 0
        #: Tokens rendered for the request, once its prompt is built.
        self.rendered: int | None = None
        #: Whether the heap was trimmed once its prompt was built (see :meth:`trim`).
        self.trimmed_built = False
        #: Ends a started stream with an error event (set once a stream started).
        self.stream_error: Callable[[str, str], bytes] | None = None

    # -- responses --------------------------------------------------------------------------

    async def start(self, status: int, content_type: str, length: int | None = None) -> None:
        headers = [(b"content-type", content_type.encode())]
        if length is not None:
            headers.append((b"content-length", str(length).encode()))
        if content_type.startswith("text/event-stream"):
            headers.append((b"cache-control", b"no-cache"))
        self.started = True
        self.gw._by_status[status] = self.gw._by_status.get(status, 0) + 1
        await self._send({"type": "http.response.start", "status": status, "headers": headers})

    async def body(self, data: bytes, *, more: bool = False) -> None:
        await self._send({"type": "http.response.body", "body": data, "more_body": more})

    async def json(self, status: int, value: Any) -> None:
        data = json.dumps(value, ensure_ascii=False).encode()
        if self.method == "HEAD":
            await self.start(status, "application/json")
            await self.body(b"")
            return
        await self.start(status, "application/json", len(data))
        await self.body(data)

    async def error(self, exc: ApiError) -> None:
        log = logger.warning if exc.status >= 500 else logger.info
        log("gateway %s %s -> %d %s: %s", self.method, self.path, exc.status, exc.kind, exc.message)
        if self.started:
            if self.stream_error is not None:  # mid-stream: the API's error event ends it
                try:
                    await self.body(self.stream_error(exc.kind, exc.message))
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    pass
            return
        if self.api == "anthropic":
            body = _anthropic.error_body(exc.kind, exc.message)
        else:
            body = _chat.error_body(exc.kind, exc.message)
        await self.json(exc.status, body)

    # -- requests ---------------------------------------------------------------------------

    async def trim(self) -> None:
        """Hand the heap's free memory back to the system (in a thread: ctypes drops the GIL):
        a big request's transient copies (the body, its decoded text, the rendered prompt, the
        tokenizer's working memory) are freed by then but stay in the threads' heaps."""
        await trio.to_thread.run_sync(trim_memory)
        self.gw._stats["heap_trims"] += 1

    async def read_body(self) -> bytearray:
        # One buffer the chunks are copied into (not a list joined at the end: a second copy
        # of the whole body at its peak), of the declared length for a request of an open
        # session (measured: a 2 MB body's peak RSS +2.3 MB, against +4.2 MB grown chunk by
        # chunk, reallocated as it grows); others' only grows with the bytes they send.
        cap = self.gw.max_body_bytes
        declared = self.headers.get("content-length", "")
        length = int(declared) if declared.isascii() and declared.isdigit() else -1
        if length > cap:
            raise ApiError(413, "too_large", f"request body over the gateway's cap of {cap} bytes")
        handle = self.gw._sessions.get(self.key())
        buf = bytearray(length if length > 0 and handle is not None else 0)
        size = 0
        while True:
            message = await self.receive()
            if message["type"] == "http.disconnect":
                raise _ClientGone
            chunk = message.get("body", b"")
            message_more = message.get("more_body", False)
            end = size + len(chunk)
            if end > cap:
                raise ApiError(
                    413, "too_large", f"request body over the gateway's cap of {cap} bytes"
                )
            if end <= len(buf):
                buf[size:end] = chunk
            else:  # no length declared, or more than it (the ASGI server decides that)
                del buf[size:]
                buf += chunk
            size = end
            del chunk, message
            if not message_more:
                del buf[size:]  # fewer bytes than declared
                self.size = size
                return buf

    def key(self) -> str:
        """The API key (or bearer token) the request presents, or ``""``."""
        key: str = self.headers.get("x-api-key", "")
        auth = self.headers.get("authorization", "")
        if not key and auth.lower().startswith("bearer "):
            key = auth[7:].strip()
        return key

    def session(self) -> GatewaySession:
        key = self.key()
        handle = self.gw._sessions.get(key) if key else None
        if handle is None or handle.finished:
            raise ApiError(
                401,
                "authentication",
                "unknown or finished session: the API key names no open trio-swe gateway session",
            )
        return handle

    async def handle(self) -> None:
        path, method = self.path, self.method
        if path in ("/", "/health", "/healthz") and method in ("GET", "HEAD"):
            await self.json(200, {"ok": True})
            return
        if path in ("/v1/models", "/models") and method == "GET":
            await self.json(200, _chat.models_body([self.gw.model_name]))
            return
        if path in ("/v1/messages/count_tokens", "/messages/count_tokens") and method == "POST":
            await self.count_tokens()
            return
        api = _ROUTES.get(path)
        if api is None:
            raise ApiError(404, "not_found", f"no route {method} {path} on the trio-swe gateway")
        if method != "POST":
            raise ApiError(405, "invalid_request", f"{path} takes POST, not {method}")
        await self.generate(api)

    async def count_tokens(self) -> None:
        body = await self.read_body()
        handle = self.session()
        # Through the session's memo, without changing it: a count is not a turn.
        conv = _anthropic.parse_request(body, handle.session.parse_memo, remember=False)

        def count() -> int:
            model = handle.session._model_for(conv.tools)
            messages = [m.template_dict() for m in conv.messages]
            cap = handle.session.prompt_cap or self.gw.max_prompt_tokens
            model.check_length(messages, cap)
            text = model.render(messages, add_generation_prompt=True)
            return len(model.encode_ids(text, limit=cap))

        try:
            n = await self.gw.tokenize(handle, len(body), count)
        except TokenLimitError as exc:
            raise ApiError(
                400,
                "context_length",
                _anthropic.context_error_message(
                    exc.tokens, handle.session.context_limit or exc.limit
                ),
            ) from None
        except ConfigError as exc:
            raise ApiError(400, "invalid_request", str(exc)) from exc
        await self.json(200, _anthropic.count_tokens_body(n))

    async def generate(self, api: str) -> None:
        body = await self.read_body()
        handle = self.session()
        session = handle.session
        # Only the messages the session's previous request of this kind did not have are
        # parsed (the memo's): a CLI resends its whole history each turn.
        conv: Conversation
        if api == "anthropic":
            conv = _anthropic.parse_request(body, session.parse_memo)
        elif api == "responses":
            conv = _responses.parse_request(body, session.parse_memo)
        else:
            conv = _chat.parse_request(body, session.parse_memo)
        # Matching on this thread; rendering and tokenizing the new messages in a worker.
        size = len(body)
        del body  # parsed: the bytes need not live through the policy call
        placement = session.place(conv)
        if size >= BIG_REQUEST_BYTES and _new_text(conv, placement.matched) >= BIG_REQUEST_BYTES:
            # The body and its decoder's scratch are free, in this thread's heap, which the
            # tokenizing thread does not build from: not held while the prompt is built.
            await self.trim()
        pending = await self.gw.tokenize(handle, size, session.build, placement)
        session.count(pending)
        self.rendered = pending.rendered_tokens + pending.delta_tokens
        if size >= BIG_REQUEST_BYTES and self.rendered >= BIG_RENDER_TOKENS:
            # Before the policy call, which may take minutes: the rendered text and the
            # tokenizer's memory are not held while the reply is generated.
            await self.trim()
            self.trimmed_built = True
        if pending.overflow:
            session.record_overflow(pending)
            n, limit = pending.overflow_tokens, session.context_limit
            message = {
                "anthropic": _anthropic.context_error_message,
                "responses": _responses.context_error_message,
                "chat": _chat.context_error_message,
            }[api](n, limit)
            raise ApiError(400, "context_length", message)
        ref = new_ref()
        stream: tuple[OutputStream, Any] | None = None
        on_tokens: Callable[[list[int]], Awaitable[None]] | None = None
        if conv.stream and self.gw.stream_policy and hasattr(self.gw.policy, "generate_stream"):
            splitter = OutputStream(pending.history.model)
            stream = (splitter, self.encoder(api, conv, ref, len(pending.prompt_ids)))

            async def on_tokens(ids: list[int]) -> None:
                deltas = splitter.feed(ids)
                if deltas:
                    await self.stream_out(stream[1], deltas)

        try:
            output = await self.call_policy(
                handle, pending.prompt_ids, pending.sampling_params, on_tokens
            )
        except ApiError:
            session.abandon(pending)
            raise
        if output is None:
            session.abandon(pending)
            raise _ClientGone
        if output.finish_reason == "abort":
            session.abandon(pending)
            raise ApiError(
                529 if api == "anthropic" else 503,
                "overloaded",
                "the policy aborted the generation; retry",
            )
        draft = await self.gw.off_thread(
            partial(session.draft, pending, output, model_name=self.gw.model_name, ref=ref)
        )
        rest: list[Delta] = []
        if stream is not None:
            # The client keeps what it was streamed: that is its copy of the reply.
            rest, draft.reply = stream[0].finish(draft.reply)
            draft.message = msgspec.structs.replace(
                draft.message, content=draft.reply.text, reasoning=draft.reply.reasoning
            )
        # Recorded before it is sent: the client may send its next request the moment it has
        # the reply, and that request must find this turn. (A client that drops the reply and
        # asks again branches off the previous turn, as any rewrite does.)
        session.commit(draft)
        try:
            if stream is not None:
                await self.stream_out(stream[1], rest, tail=draft.reply)
            else:
                await self.send_reply(api, conv, draft.reply)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            raise _ClientGone from None

    def encoder(self, api: str, conv: Conversation, ref: str, input_tokens: int) -> Any:
        """The API's :class:`ReplyStream` for a streamed reply."""
        model = self.gw.model_name or conv.model
        if api == "anthropic":
            return _anthropic.ReplyStream(ref, model, input_tokens)
        if api == "responses":
            return _responses.ReplyStream(ref, model, input_tokens)
        return _chat.ReplyStream(ref, model, input_tokens, include_usage=conv.include_usage)

    async def stream_out(
        self, encoder: Any, deltas: Sequence[Delta], *, tail: Reply | None = None
    ) -> None:
        """Send ``deltas`` (and with ``tail``, the rest of the reply and its end), opening the
        SSE response first if needed."""
        data = b""
        if not self.started:
            await self.start(200, "text/event-stream; charset=utf-8")
            self.stream_error = {
                "anthropic": _anthropic.stream_error,
                "responses": _responses.stream_error,
                "chat": _chat.stream_error,
            }[self.api]
            data = encoder.head()
        for delta in deltas:
            if delta.channel == "reasoning":
                data += encoder.reasoning(delta.text)
            else:
                data += encoder.text(delta.text)
        if tail is None:
            await self.body(data, more=True)
        else:
            await self.body(data + encoder.tail(tail))

    async def call_policy(
        self,
        handle: GatewaySession,
        ids: Any,
        params: Mapping[str, Any],
        on_tokens: Callable[[list[int]], Awaitable[None]] | None = None,
    ) -> PolicyOutput | None:
        """The policy's output, or None when the client went away (the call is cancelled).

        With ``on_tokens`` the output is streamed (``generate_stream``) and handed to it as it
        comes; a client gone while it is being sent ends the call as a disconnect does.
        """
        result: list[PolicyOutput] = []
        gone = False
        failure: list[BaseException] = []

        async def watch(scope: trio.CancelScope) -> None:
            nonlocal gone
            while True:
                message = await self.receive()
                if message["type"] == "http.disconnect":
                    gone = True
                    scope.cancel()
                    return

        self.gw._stats["policy_calls"] += 1
        t0 = trio.current_time()
        with trio.CancelScope() as scope:
            handle._inflight.add(scope)
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(watch, nursery.cancel_scope)
                    try:
                        if on_tokens is None:
                            out = await self.gw.policy.generate(
                                ids, params, session_id=handle.session_id
                            )
                        else:
                            out = await self.gw.policy.generate_stream(  # type: ignore[attr-defined]
                                ids, params, session_id=handle.session_id, on_tokens=on_tokens
                            )
                        result.append(out)
                    except PolicyError as exc:
                        failure.append(exc)
                    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                        gone = True  # the client went away while its stream was sent
                    nursery.cancel_scope.cancel()
            finally:
                handle._inflight.discard(scope)
                handle.session.add_policy_time(trio.current_time() - t0)
        if failure:
            self.gw._stats["policy_errors"] += 1
            raise ApiError(500, "api_error", f"the policy failed: {failure[0]}")
        if gone or scope.cancelled_caught or not result:
            if handle.finished and not gone:
                raise ApiError(401, "authentication", "the session finished during the request")
            return None
        return result[0]

    async def send_reply(self, api: str, conv: Conversation, reply: Reply) -> None:
        if not conv.stream:
            value = {
                "anthropic": _anthropic.reply_json,
                "responses": _responses.reply_json,
                "chat": _chat.reply_json,
            }[api](reply)
            await self.json(200, value)
            return
        events: Iterable[bytes]
        if api == "anthropic":
            events = _anthropic.reply_events(reply)
        elif api == "responses":
            events = _responses.reply_events(reply)
        else:
            events = _chat.reply_chunks(reply, include_usage=conv.include_usage)
        await self.start(200, "text/event-stream; charset=utf-8")
        # One write: the reply is complete already (the policy is not streamed), and one
        # send per event would cost a syscall each.
        await self.body(b"".join(events))


def trim_memory() -> None:
    """Give the C heap's free memory back to the system (glibc only; elsewhere nothing).

    Tokenizing a big prompt allocates in the tokenizing threads' malloc arenas; glibc keeps
    what is freed there for reuse, so the process stays as big as its largest request
    (measured: +204 MB after one refused 2 MB message, +16 MB after a trim).
    """
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)


#: Blocks of at least this many bytes are mapped on their own (see :func:`map_big_blocks`).
MMAP_THRESHOLD_BYTES = 1 << 20


@functools.cache
def map_big_blocks() -> None:
    """Have glibc map every block of :data:`MMAP_THRESHOLD_BYTES` or more on its own, given
    back to the system when freed (once per process; glibc only; not when the process set its
    own threshold through ``MALLOC_MMAP_THRESHOLD_`` or ``GLIBC_TUNABLES``).

    glibc's default threshold moves: it rises to the size of any mapped block freed (up to
    32 MiB), after which a big request's transient copies (the JSON decoder's text of the
    body, the chat template's concatenations, the tokenizer's arrays) are carved from the
    heaps of the threads that made them and stay there, each thread's heap as big as its own
    peak. Measured (``python -m bench gateway_load``): the peak RSS growth before the policy
    call of a served 2 MB prompt +17.2 -> +12.7 MB, of an 8 MB one refused by the token cap
    +34.2 -> +24.9 MB. The cost: a mapping per such block (its pages zeroed on first touch)
    where a heap could have reused one.
    """
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    if "MALLOC_MMAP_THRESHOLD_" in os.environ or "mmap_threshold" in tunables:
        return
    libc = _libc()
    if libc is not None:
        libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)


_M_MMAP_THRESHOLD = -3  # malloc.h


@functools.cache
def _libc() -> Any:
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
        libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        return libc
    except (OSError, AttributeError):
        return None


def _new_text(conv: Conversation, matched: int) -> int:
    """Characters of text in ``conv``'s messages past the ``matched`` ones (a floor of what
    its prompt's build renders anew)."""
    return sum(len(m.content) for m in conv.messages[matched:])


async def _serve(
    app: Gateway, config: Any, listeners: list[trio.SocketListener], *, task_status: Any
) -> None:
    from hypercorn.trio.tcp_server import TCPServer
    from hypercorn.trio.worker_context import WorkerContext
    from hypercorn.utils import wrap_app

    wrapped = wrap_app(app, config.wsgi_max_body_size, "asgi")  # type: ignore[arg-type]
    context = WorkerContext(None)

    async def handle(stream: trio.SocketStream) -> None:
        try:
            await TCPServer(wrapped, config, context, {}, stream).run()  # type: ignore[arg-type]
        except Exception as exc:  # one broken connection must not stop the server
            logger.debug("gateway connection failed: %r", exc)
            await trio.aclose_forcefully(stream)

    task_status.started()
    await trio.serve_listeners(handle, listeners)


@asynccontextmanager
async def open_gateway(
    policy: Policy,
    tokenizer: Any,
    *,
    host: str | None = "127.0.0.1",
    port: int = 0,
    unix_socket: str | os.PathLike[str] | None = None,
    tool_parser: str = "auto",
    template_kwargs: Mapping[str, Any] | None = None,
    model_name: str = "trio-swe-policy",
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    max_sessions: int = 4096,
    tokenizer_threads: int = 2,
    stream_policy: bool = True,
    tool_cache_bytes: int = DEFAULT_TOOL_CACHE_BYTES,
    max_prompt_tokens: int = DEFAULT_MAX_PROMPT_TOKENS,
    keep_sampled: bool = True,
) -> AsyncIterator[Gateway]:
    """Serve the recording gateway for the block's duration.

    The first call fixes glibc's mmap threshold for the process (:func:`map_big_blocks`), so
    that a big request's transient copies go back to the system when freed.

    Args:
        policy: where completions come from (e.g. :class:`~trio_swe.agents.SGLangPolicy`).
        tokenizer: the checkpoint's Hugging Face tokenizer (see :func:`trio_swe.models.load_tokenizer`).
        host: TCP address to listen on (None: no TCP listener).
        port: TCP port (0: a free one; see :attr:`Gateway.url`).
        unix_socket: also (or only) listen on this unix socket path, e.g. for sandboxes without
            a network that reach the gateway through a forwarder.
        tool_parser: the tool-call parser name, or ``"auto"`` (from the template).
        template_kwargs: extra variables of every render.
        model_name: the model name reported to clients.
        max_body_bytes: cap of a request body (413 above it, refused before it is read
            whole when the client declares its length).
        max_prompt_tokens: cap of any prompt in tokens, besides each session's
            ``max_context_tokens``; over it, the API's context-length error.
        keep_sampled: a user or system message continuing a chain is appended to its tokens
            even where the template would re-render earlier turns (Qwen3 drops their
            reasoning): cost per request in proportion to the new messages, one sample per
            chain. False: fork and render the whole conversation as the template would.
        max_sessions: cap of sessions open at once.
        tokenizer_threads: worker threads that render and tokenize requests (0: on the trio
            thread, which then stalls every other session while it tokenizes).
        stream_policy: stream the policy's output into SSE replies as it is generated, when
            the policy can (``generate_stream``, as :class:`~trio_swe.agents.SGLangPolicy`):
            text and reasoning deltas as they come, tool calls once they parsed.
        tool_cache_bytes: bound of the chat models cached by tool list (the JSON bytes of
            their lists; a list over it alone is built per request, not kept).
    """
    try:
        from hypercorn.config import Config
    except ImportError as exc:
        raise ConfigError("the gateway needs hypercorn: pip install 'trio-swe[gateway]'") from exc
    if host is None and unix_socket is None:
        raise InvalidArgumentError("open_gateway needs a host, a unix_socket or both")
    map_big_blocks()
    gateway = Gateway(
        policy,
        tokenizer,
        tool_parser=tool_parser,
        template_kwargs=template_kwargs,
        model_name=model_name,
        max_body_bytes=max_body_bytes,
        max_sessions=max_sessions,
        tokenizer_threads=tokenizer_threads,
        stream_policy=stream_policy,
        tool_cache_bytes=tool_cache_bytes,
        max_prompt_tokens=max_prompt_tokens,
        keep_sampled=keep_sampled,
    )
    config = Config()
    config.accesslog = None
    config.errorlog = logger
    config.keep_alive_timeout = 600
    config.h11_max_incomplete_size = 64 * 1024
    listeners: list[trio.SocketListener] = []
    path: str | None = None
    try:
        if host is not None:
            tcp = await trio.open_tcp_listeners(port, host=host)
            listeners.extend(tcp)
            bound = tcp[0].socket.getsockname()
            gateway.url = f"http://{host}:{bound[1]}"
        if unix_socket is not None:
            path = os.fspath(unix_socket)
            sock = trio.socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
            try:  # a stale socket of a crashed run
                os.unlink(path)
            except FileNotFoundError:
                pass
            await sock.bind(path)
            os.chmod(path, 0o777)  # sandbox users (agent) connect to it
            sock.listen(256)
            listeners.append(trio.SocketListener(sock))
            gateway.unix_socket = path
        # Our nursery: the caller's own error comes out as itself (the server's next to it as
        # a note), not in a group.
        async with open_private_nursery("the gateway's server") as nursery:
            await nursery.start(_serve, gateway, config, listeners)
            try:
                yield gateway
            finally:
                for handle in list(gateway._sessions.values()):
                    handle.finish()
                nursery.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True):
            for listener in listeners:
                await listener.aclose()
        if path is not None:
            try:
                os.unlink(path)
            except OSError:
                pass

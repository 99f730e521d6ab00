"""A scripted, SGLang-compatible policy server on loopback, for demos and tests.

It is a real HTTP/1.1 server (h11 over trio sockets) that answers SGLang's ``POST /generate``
(``input_ids`` + ``sampling_params`` + ``return_logprob``) with completions replayed from a
script, tokenized by a given tokenizer, with deterministic log-probs
(:func:`scripted_logprob`), so a test can check every log-prob of a sample against the token it
belongs to. It is stateless per request: the script is chosen by a key found in the decoded prompt
(``Instance: <key>`` by default) and the turn by how many times the assistant header occurs in
it, so concurrent episodes, retries and resumed runs all replay consistently.

With a :class:`~trio_swe.models.ChatModel` (a real checkpoint's tokenizer and template), the
server plays each scripted turn in the model's own format: a text-dialect script entry
(reasoning, then one ```` ```bash ```` block) becomes an assistant message with that reasoning and
a ``bash`` tool call, which the checkpoint's template renders exactly as the model would sample
it (``<think>...</think>``, ``<tool_call>...</tool_call>``, the stop token); that text is
encoded with the real tokenizer and returned as ids with log-probs. An entry without a block is
played as plain text (an ill-formed turn for a tool-calling agent).

Also served: ``POST /abort_request`` (cancels a pending generation with that ``rid``), ``GET
/health`` and ``GET /get_model_info``.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import h11
import msgspec
import trio

from .._groups import open_private_nursery
from ..agents._bash_agent import parse_command
from ..models import ChatModel, ParsedOutput, ToolCall
from ..policy import ByteTokenizer, Tokenizer, vocabulary_size

__all__ = [
    "ScriptedCompletion",
    "ScriptedPolicyServer",
    "ScriptedServerStatistics",
    "open_scripted_policy_server",
    "scripted_logprob",
]

#: The assistant header of the bash agent's chat format; one occurrence per turn in a prompt.
DEFAULT_TURN_MARKER = "<|im_start|>assistant\n"
#: Where the script key is found in the decoded prompt.
DEFAULT_KEY_PATTERN = r"^Instance: (\S+)\s*$"
#: What the policy says once its script is exhausted (or for an unknown key).
DEFAULT_FALLBACK = "Nothing left to do.\n```bash\nsubmit\n```"
#: Appended to every completion, as a chat model ends its turn.
END_OF_TURN = "<|im_end|>"

_MAX_BODY = 64 * 1024 * 1024


def scripted_logprob(token_id: int, position: int) -> float:
    """The log-prob the scripted server reports for ``token_id`` at ``position`` of an output.

    Deterministic and different for neighbouring positions, so a test can prove each log-prob of
    a sample is aligned with its own token.
    """
    return -(((token_id * 31 + position * 7) % 97) + 1) / 100.0


class ScriptedServerStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """Counters of a :class:`ScriptedPolicyServer` (:meth:`ScriptedPolicyServer.statistics`).

    Attributes:
        requests: HTTP requests served.
        generations: ``/generate`` calls answered.
        aborts: ``/abort_request`` calls.
        active: generations in flight now.
        errors: malformed requests.
    """

    requests: int = 0
    generations: int = 0
    aborts: int = 0
    active: int = 0
    errors: int = 0


class ScriptedCompletion(msgspec.Struct, frozen=True):
    """One scripted completion: its text and how long the "generation" takes.

    ``token_ids``, when set, are returned as they are instead of the encoded text (to play a
    broken policy, e.g. ids outside the vocabulary).

    ``repeat``: this completion answers its own turn and every later one (a model stuck doing
    the same thing), so an episode scripted to overrun its time budget overruns it whatever
    the agent's per-call tool timeout returns control after (Codex's ``exec_command`` yields
    after at most 30 s; a loop of such calls still fills the budget).
    """

    text: str
    delay_sec: float = 0.0
    token_ids: tuple[int, ...] | None = None
    repeat: bool = False


def model_format(model: ChatModel, text: str) -> str:
    """A text-dialect script entry as ``model`` samples it: reasoning and a ``bash`` tool call
    (or plain content when the entry has no command block), in the checkpoint's own template
    format, stop token included."""
    command = parse_command(text)
    if command is None:
        message = ParsedOutput(text=text, content=text).message()
    else:
        reasoning = text[: text.find("```")].strip()
        call = ToolCall("bash", {"command": command})
        message = ParsedOutput(text="", reasoning=reasoning, tool_calls=(call,)).message()
    return model.assistant_text(message)


class _GenerateRequest(msgspec.Struct):
    input_ids: list[int]
    rid: str | None = None
    sampling_params: dict[str, Any] = {}
    return_logprob: bool = False
    stream: bool = False


#: Tokens per streamed chunk (``stream: true``).
STREAM_CHUNK_TOKENS = 4

#: A streamed reply: writes its pieces with the given send.
_Writer = Callable[[Callable[[bytes], Awaitable[None]]], Awaitable[None]]


class _Abort:
    """An ``/abort_request`` of a streamed generation (it stops between chunks)."""

    def __init__(self) -> None:
        self.event = trio.Event()

    def cancel(self) -> None:
        self.event.set()


class _AbortRequest(msgspec.Struct):
    rid: str = ""


class ScriptedPolicyServer:
    """The running server; obtain it from :func:`open_scripted_policy_server`."""

    def __init__(
        self,
        scripts: Mapping[str, Sequence[str | ScriptedCompletion]],
        *,
        tokenizer: Tokenizer | ChatModel,
        turn_marker: str,
        key_pattern: str,
        fallback: str,
        incremental_streaming: bool = False,
    ) -> None:
        self._incremental = incremental_streaming
        self._scripts = {
            key: [c if isinstance(c, ScriptedCompletion) else ScriptedCompletion(c) for c in seq]
            for key, seq in scripts.items()
        }
        self._tokenizer = tokenizer
        self._turn_marker = turn_marker
        self._key_re = re.compile(key_pattern, re.MULTILINE)
        self._fallback = fallback
        self._pending: dict[str, trio.CancelScope | _Abort] = {}
        self.aborted_rids: list[str] = []
        #: The sampling parameters of each generation request, in arrival order.
        self.sampling_params_seen: list[dict[str, Any]] = []
        self.port = 0
        self._stats = {"requests": 0, "generations": 0, "aborts": 0, "active": 0, "errors": 0}

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:41234``."""
        return f"http://127.0.0.1:{self.port}"

    def statistics(self) -> ScriptedServerStatistics:
        """Requests, generations, aborts, generations in flight, malformed requests."""
        return ScriptedServerStatistics(**self._stats)

    def completion_for(self, prompt: str) -> ScriptedCompletion:
        """What the script answers to the decoded ``prompt`` (exposed for tests)."""
        match = self._key_re.search(prompt)
        script = self._scripts.get(match.group(1), []) if match else []
        turn = max(prompt.count(self._turn_marker) - 1, 0)
        for i, completion in enumerate(script[: turn + 1]):
            if i == turn or completion.repeat:
                return completion
        return ScriptedCompletion(self._fallback)

    async def _generate(self, body: bytes) -> tuple[int, bytes | _Writer]:
        try:
            request = msgspec.json.decode(body, type=_GenerateRequest)
        except msgspec.DecodeError as exc:
            self._stats["errors"] += 1
            return 400, msgspec.json.encode({"error": str(exc)})
        self._stats["generations"] += 1
        self.sampling_params_seen.append(dict(request.sampling_params))
        tok = self._tokenizer
        size = vocabulary_size(tok)
        if size is not None and any(not 0 <= i < size for i in request.input_ids):
            self._stats["errors"] += 1
            return 400, msgspec.json.encode({"error": "input_ids outside the vocabulary"})
        prompt = tok.decode(request.input_ids)
        completion = self.completion_for(prompt)
        if completion.token_ids is not None:
            ids = list(completion.token_ids)
        elif isinstance(tok, ChatModel):
            ids = tok.encode(model_format(tok, completion.text))
        else:
            ids = tok.encode(completion.text + END_OF_TURN, add_special_tokens=False)
        finish = "stop"
        max_new = request.sampling_params.get("max_new_tokens")
        if isinstance(max_new, int) and 0 <= max_new < len(ids):
            ids = ids[:max_new]
            finish = "length"
        rid = request.rid or ""
        if request.stream:
            return 200, self._stream(request, completion, ids, finish)
        with trio.CancelScope() as scope:
            if rid:
                self._pending[rid] = scope
            self._stats["active"] += 1
            try:
                await trio.sleep(completion.delay_sec)
            finally:
                self._stats["active"] -= 1
                self._pending.pop(rid, None)
        if scope.cancelled_caught:
            ids, finish = [], "abort"
        logprobs = [[scripted_logprob(t, i), t, None] for i, t in enumerate(ids)]
        reply = {
            "text": "" if completion.token_ids is not None else tok.decode(ids),
            "output_ids": ids,
            "meta_info": {
                "id": rid,
                "prompt_tokens": len(request.input_ids),
                "completion_tokens": len(ids),
                "finish_reason": {"type": finish},
                "output_token_logprobs": logprobs if request.return_logprob else [],
            },
        }
        return 200, msgspec.json.encode(reply)

    def _stream(
        self,
        request: _GenerateRequest,
        completion: ScriptedCompletion,
        ids: list[int],
        finish: str,
    ) -> _Writer:
        """SGLang's streamed ``/generate``: a chunk per few tokens, the generation's delay
        spread over them; each chunk holds the output so far (SGLang's default) or, with
        ``incremental_streaming``, only its new tokens; then ``data: [DONE]``."""
        rid = request.rid or ""
        step = STREAM_CHUNK_TOKENS
        pieces = [ids[i : i + step] for i in range(0, len(ids), step)]
        pause = completion.delay_sec / max(len(pieces), 1)

        async def write(send: Callable[[bytes], Awaitable[None]]) -> None:
            abort = _Abort()
            if rid:
                self._pending[rid] = abort
            self._stats["active"] += 1
            sent: list[int] = []
            try:
                for k, piece in enumerate(pieces):
                    with trio.move_on_after(pause):
                        await abort.event.wait()
                    if abort.event.is_set():
                        break
                    start = len(sent)
                    sent.extend(piece)
                    last = k == len(pieces) - 1
                    shown, offset = (piece, start) if self._incremental else (sent, 0)
                    await send(
                        self._chunk(request, shown, offset, len(sent), finish if last else None)
                    )
            finally:
                self._stats["active"] -= 1
                self._pending.pop(rid, None)
            if abort.event.is_set() or not pieces:
                tail = [] if self._incremental else sent
                done = "abort" if abort.event.is_set() else finish
                await send(self._chunk(request, tail, 0, len(sent), done))
            await send(b"data: [DONE]\n\n")

        return write

    def _chunk(
        self,
        request: _GenerateRequest,
        ids: list[int],
        offset: int,
        total: int,
        finish: str | None,
    ) -> bytes:
        logprobs = [[scripted_logprob(t, offset + i), t, None] for i, t in enumerate(ids)]
        data = {
            "text": self._tokenizer.decode(ids),
            "output_ids": ids,
            "meta_info": {
                "id": request.rid or "",
                "prompt_tokens": len(request.input_ids),
                "completion_tokens": total,
                "finish_reason": {"type": finish} if finish else None,
                "output_token_logprobs": logprobs if request.return_logprob else [],
            },
        }
        return b"data: " + msgspec.json.encode(data) + b"\n\n"

    def _abort(self, body: bytes) -> tuple[int, bytes]:
        try:
            rid = msgspec.json.decode(body, type=_AbortRequest).rid
        except msgspec.DecodeError:
            rid = ""
        self._stats["aborts"] += 1
        self.aborted_rids.append(rid)
        scope = self._pending.get(rid)
        if scope is not None:
            scope.cancel()
        return 200, b"{}"

    async def _route(
        self, method: bytes, target: bytes, body: bytes
    ) -> tuple[int, bytes | _Writer]:
        path = target.split(b"?", 1)[0]
        if method == b"POST" and path == b"/generate":
            return await self._generate(body)
        if method == b"POST" and path == b"/abort_request":
            return self._abort(body)
        if method == b"GET" and path in (b"/health", b"/health_generate"):
            return 200, b"{}"
        if method == b"GET" and path == b"/get_model_info":
            return 200, msgspec.json.encode(
                {"model_path": "trio-swe-scripted", "is_generation": True}
            )
        return 404, b'{"error": "not found"}'

    async def _serve_connection(self, stream: trio.SocketStream) -> None:
        conn = h11.Connection(h11.SERVER)
        async with stream:
            while True:
                try:
                    request = await _next_event(conn, stream)
                    if not isinstance(request, h11.Request):
                        return
                    body = bytearray()
                    while True:
                        event = await _next_event(conn, stream)
                        if isinstance(event, h11.Data):
                            body += event.data
                            if len(body) > _MAX_BODY:
                                return
                        elif isinstance(event, h11.EndOfMessage):
                            break
                        else:
                            return
                    self._stats["requests"] += 1
                    status, payload = await self._route(request.method, request.target, bytes(body))
                    if isinstance(payload, bytes):
                        headers = [
                            ("content-type", "application/json"),
                            ("content-length", str(len(payload))),
                        ]
                        await stream.send_all(
                            conn.send(h11.Response(status_code=status, headers=headers))
                        )
                        await stream.send_all(conn.send(h11.Data(data=payload)))
                    else:  # streamed (chunked): each piece as it is produced
                        headers = [("content-type", "text/event-stream")]
                        await stream.send_all(
                            conn.send(h11.Response(status_code=status, headers=headers))
                        )

                        async def send(piece: bytes) -> None:
                            await stream.send_all(conn.send(h11.Data(data=piece)))

                        await payload(send)
                    await stream.send_all(conn.send(h11.EndOfMessage()))
                    if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                        return
                    conn.start_next_cycle()
                except (h11.ProtocolError, trio.BrokenResourceError, trio.ClosedResourceError):
                    return


async def _next_event(conn: h11.Connection, stream: trio.SocketStream) -> object:
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            conn.receive_data(await stream.receive_some(65536))
            continue
        return event


@asynccontextmanager
async def open_scripted_policy_server(
    scripts: Mapping[str, Sequence[str | ScriptedCompletion]],
    *,
    tokenizer: Tokenizer | ChatModel | None = None,
    turn_marker: str | None = None,
    key_pattern: str = DEFAULT_KEY_PATTERN,
    fallback: str = DEFAULT_FALLBACK,
    incremental_streaming: bool = False,
) -> AsyncIterator[ScriptedPolicyServer]:
    """Serve scripted completions on ``127.0.0.1`` (a free port) for the block's duration.

    Args:
        scripts: per key (an instance id), the completions of turns 0, 1, 2, ... as text or
            :class:`ScriptedCompletion` (with a delay).
        tokenizer: how prompts are decoded and completions encoded: a :class:`ByteTokenizer` by
            default (the text dialect of the demo's bash agent), or a
            :class:`~trio_swe.models.ChatModel` to play the scripts in that checkpoint's format.
        turn_marker: the assistant header counted to find the turn number (default: the
            model's generation prompt, or ChatML's ``<|im_start|>assistant\\n``).
        key_pattern: regex with one group finding the key in the decoded prompt.
        fallback: the completion after a script is exhausted or for an unknown key.
        incremental_streaming: streamed chunks hold only their new tokens (SGLang's
            ``--incremental-streaming-output``), not the output so far.

    Example::

        async with open_scripted_policy_server({"demo-1": ["```bash\\nls\\n```"]}) as server:
            policy = SGLangPolicy(server.url)
    """
    server = ScriptedPolicyServer(
        scripts,
        tokenizer=tokenizer or ByteTokenizer(),
        turn_marker=turn_marker
        or (tokenizer.generation_prompt if isinstance(tokenizer, ChatModel) else "")
        or DEFAULT_TURN_MARKER,
        key_pattern=key_pattern,
        fallback=fallback,
        incremental_streaming=incremental_streaming,
    )
    # The nursery is ours: the caller's own exception comes out as itself, not in a group.
    async with open_private_nursery("the scripted policy server") as nursery:
        listeners = await nursery.start(
            partial(trio.serve_tcp, server._serve_connection, 0, host="127.0.0.1")
        )
        server.port = listeners[0].socket.getsockname()[1]
        try:
            yield server
        finally:
            nursery.cancel_scope.cancel()

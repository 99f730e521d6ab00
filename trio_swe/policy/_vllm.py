"""vLLM as a :class:`~trio_swe.policy.Policy`: token ids in, sampled ids and log-probs out.

Two routes, the same contract:

* ``"generate"``: ``POST /inference/v1/generate`` (vLLM's token-in/token-out route, served with
  ``--enable-scale-out``): ``{"request_id", "token_ids", "sampling_params"}``; the reply's
  ``choices[0]`` holds ``token_ids``, ``logprobs.content[i].{token_id, logprob}`` and
  ``finish_reason``. Cancelling aborts the request (``/inference/v1/abort_requests``, and the
  server's own abort on disconnect).
* ``"completions"``: ``POST /v1/completions`` with the prompt as a list of ids,
  ``return_token_ids`` and ``logprobs: 0``, for engines without the route (any OpenAI-compatible
  vLLM). A cancelled request is aborted by the disconnect.

Sampling parameters come in SGLang's names (``max_new_tokens``, ...) and are translated here.
The log-probs are what the engine reports: under ``--logprobs-mode processed_logprobs`` those of
the distribution it sampled from (temperature and top-p/top-k applied), which an importance
ratio needs; under vLLM's default (``raw_logprobs``) those of the raw logits, whatever the
temperature. Every reply is checked before it becomes a :class:`PolicyOutput`: ids are ints in
the vocabulary (when it is known), one finite log-prob <= 0 per id; anything else is a
:class:`~trio_swe.PolicyError` naming the engine, the route and the request, never a sample.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Final, Literal

import httpx
import msgspec
import trio

from .._errors import InvalidArgumentError, PolicyError
from ._http import HttpPolicy, IdsBody
from ._types import PolicyOutput

__all__ = ["VLLMPolicy", "vllm_sampling_params"]

Route = Literal["generate", "completions"]

#: SGLang's sampling-parameter names that vLLM spells otherwise.
_RENAMED: Final = {"max_new_tokens": "max_tokens", "min_new_tokens": "min_tokens"}
#: Set by the client, whatever the caller asks: one sequence, the sampled token's log-prob only.
_OWNED: Final = frozenset({"n", "logprobs", "prompt_logprobs"})
#: SGLang's options about its text output or its reply, meaningless for token output: dropped.
_TEXT_ONLY: Final = frozenset({"no_stop_trim", "return_logprob", "return_text_in_logprobs"})
#: vLLM's public ``SamplingParams`` fields (0.32) the caller may set. vLLM ignores a field it
#: does not know, so a misspelt ``temperatur`` would sample at the default temperature and
#: train on it: anything else is refused here.
_VLLM_FIELDS: Final = frozenset(
    {
        "presence_penalty", "frequency_penalty", "repetition_penalty", "temperature", "top_p",
        "top_k", "min_p", "seed", "stop", "stop_token_ids", "ignore_eos", "max_tokens",
        "min_tokens", "detokenize", "skip_special_tokens", "spaces_between_special_tokens",
        "include_stop_str_in_output", "structured_outputs", "logit_bias", "allowed_token_ids",
        "extra_args", "bad_words", "thinking_token_budget", "repetition_detection",
    }
)  # fmt: skip

#: Bound on the shielded abort sent when a generation is cancelled.
ABORT_TIMEOUT_SEC = 5.0
#: The generate route names its engine request ``generate-tokens-<request_id>`` (vLLM 0.32),
#: and the abort route matches that name only: an abort by ``<request_id>`` alone is a no-op.
_GENERATE_ID_PREFIX: Final = "generate-tokens-"
#: A log-prob above this is not a log-probability (float32 rounding stays far below it).
_LOGPROB_MAX = 1e-4


def vllm_sampling_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """vLLM's ``sampling_params`` for SGLang-named ``params``.

    Raises:
        InvalidArgumentError: ``params`` asks for more than one sequence (``n``), which a
            turn of an episode never is, or names a parameter vLLM does not know (it would
            ignore it).
    """
    out: dict[str, Any] = {}
    for key, value in params.items():
        if key in _TEXT_ONLY:
            continue
        if key in _OWNED:
            if key == "n" and value not in (None, 1):
                raise InvalidArgumentError(f"sampling_params n={value!r}: one sequence per call")
            continue
        name = _RENAMED.get(key, key)
        if name not in _VLLM_FIELDS:
            raise InvalidArgumentError(
                f"sampling_params {key!r}: not a vLLM sampling parameter (vLLM would ignore "
                f"it); known: {', '.join(sorted(_VLLM_FIELDS | _RENAMED.keys()))}"
            )
        out[name] = value
    out["n"] = 1
    out["logprobs"] = 0  # the sampled token's own log-prob, no alternatives
    return out


# Replies, decoded into what is checked and kept (msgspec skips the rest).


class _LogprobEntry(msgspec.Struct, gc=False):
    token_id: int
    logprob: float | None = None


class _Logprobs(msgspec.Struct):
    content: list[_LogprobEntry] | None = None


class _Choice(msgspec.Struct):
    token_ids: list[int] | None = None
    logprobs: _Logprobs | None = None
    finish_reason: str | None = None


class _GenerateReply(msgspec.Struct):
    choices: list[_Choice]


class _CompletionLogprobs(msgspec.Struct):
    token_logprobs: list[float | None] = []


class _CompletionChoice(msgspec.Struct):
    token_ids: list[int] | None = None
    logprobs: _CompletionLogprobs | None = None
    finish_reason: str | None = None


class _CompletionReply(msgspec.Struct):
    choices: list[_CompletionChoice]


_decode_generate = msgspec.json.Decoder(_GenerateReply).decode
_decode_completion = msgspec.json.Decoder(_CompletionReply).decode


def _finish(reason: str | None, done: bool) -> str:
    # vLLM's reasons are SGLang's ("stop", "length", "abort"); a reply without one ended
    # normally (OpenAI's default) unless the stream was cut, which raises before this.
    if reason is None:
        return "stop" if done else "abort"
    return reason


class _Checker:
    """The checks every reply passes, with the words that name what failed."""

    def __init__(self, where: str, vocab_size: int | None) -> None:
        self.where = where
        self.vocab_size = vocab_size

    def output(
        self, ids: list[int], log_probs: Sequence[float | None], finish: str
    ) -> PolicyOutput:
        if len(ids) != len(log_probs):
            raise PolicyError(f"{self.where}: {len(ids)} token ids but {len(log_probs)} log-probs")
        limit = self.vocab_size
        for i, (tid, lp) in enumerate(zip(ids, log_probs, strict=True)):
            if tid < 0 or (limit is not None and tid >= limit):
                raise PolicyError(
                    f"{self.where}: token id {tid} at position {i} is outside the vocabulary"
                    + (f" (size {limit})" if limit is not None else "")
                )
            if lp is None or not (math.isfinite(lp) and lp <= _LOGPROB_MAX):
                raise PolicyError(f"{self.where}: log-prob {lp!r} of token {i} is not one")
        return PolicyOutput(output_ids=ids, log_probs=list(log_probs), finish_reason=finish)  # type: ignore[arg-type]


class VLLMPolicy(HttpPolicy):
    """A :class:`~trio_swe.policy.Policy` served by vLLM, token in and token out.

    Use as an async context manager, or call :meth:`aclose`::

        async with VLLMPolicy("http://127.0.0.1:8000", vocab_size=len(tokenizer)) as policy:
            out = await policy.generate(ids, {"max_new_tokens": 512, "temperature": 1.0})

    It is also a :class:`~trio_swe.policy.StreamingPolicy` on the ``generate`` route.
    """

    def __init__(
        self,
        base_url: str,
        *,
        route: Route = "generate",
        model: str | None = None,
        vocab_size: int | None = None,
        defaults: Mapping[str, Any] | None = None,
        client: httpx.AsyncClient | None = None,
        read_timeout_sec: float | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        """Create the client.

        Args:
            base_url: the server, e.g. ``http://127.0.0.1:8000``.
            route: ``"generate"`` (``/inference/v1/generate``) or ``"completions"``
                (``/v1/completions`` with prompt ids).
            model: the served model's name; the completions route asks ``/v1/models`` when
                it is not given.
            vocab_size: ids at or above it are refused as malformed (the tokenizer's
                ``len()``); ``None`` checks only that ids are non-negative.
            defaults: sampling parameters (SGLang's names) under each call's own.
            client: an httpx client to share; one is created (and closed by :meth:`aclose`)
                otherwise.
            read_timeout_sec: bound on one generation; ``None`` waits as long as the
                caller's cancel scope allows.
            headers: extra headers of every request (e.g. authorization).

        Raises:
            InvalidArgumentError: an unknown route.
        """
        if route not in ("generate", "completions"):
            raise InvalidArgumentError(f"VLLMPolicy route {route!r}: 'generate' or 'completions'")
        super().__init__(
            base_url,
            client=client,
            read_timeout_sec=read_timeout_sec,
            # vLLM refuses a body without this content type (415 as a 400).
            headers={"content-type": "application/json", **(headers or {})},
            defaults=defaults,
        )
        self.route: Route = route
        self.model = model
        self.vocab_size = vocab_size
        self._model_lock = trio.Lock()

    @property
    def _path(self) -> str:
        return "/inference/v1/generate" if self.route == "generate" else "/v1/completions"

    async def _body(
        self,
        rid: str,
        input_ids: Sequence[int],
        sampling_params: Mapping[str, Any],
        *,
        stream: bool = False,
    ) -> IdsBody:
        params = vllm_sampling_params({**self.defaults, **sampling_params})
        more = {"stream": True} if stream else {}
        if self.route == "generate":
            fields: dict[str, Any] = {"request_id": rid, "sampling_params": params, **more}
            if self.model:
                fields["model"] = self.model
            return IdsBody(fields, "token_ids", input_ids)
        # /v1/completions takes the sampling parameters at the top level.
        fields = {
            **params,
            "model": await self._model_name(),
            "return_token_ids": True,
            "request_id": rid,
            **more,
        }
        return IdsBody(fields, "prompt", input_ids)

    async def _model_name(self) -> str:
        async with self._model_lock:
            if self.model is None:
                where = f"vLLM at {self.base_url} GET /v1/models"
                try:
                    response = await self._client.get(
                        f"{self.base_url}/v1/models", headers=self._headers
                    )
                    response.raise_for_status()
                    self.model = str(response.json()["data"][0]["id"])
                except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
                    raise PolicyError(
                        f"{where}: no served model name ({type(exc).__name__}: {exc}); "
                        "pass VLLMPolicy(model=...)"
                    ) from exc
            return self.model

    def _where(self, rid: str) -> str:
        return f"vLLM at {self.base_url} POST {self._path} (request {rid})"

    async def generate(
        self,
        input_ids: Sequence[int],
        sampling_params: Mapping[str, Any],
        *,
        session_id: str | None = None,
    ) -> PolicyOutput:
        """See :meth:`~trio_swe.policy.Policy.generate`."""
        rid = f"trio-swe-{uuid.uuid4().hex}"
        where = self._where(rid)
        body = await self._body(rid, input_ids, sampling_params)
        self._stats["requests"] += 1
        try:
            response = await self._client.post(
                f"{self.base_url}{self._path}",
                content=body,
                headers={**self._headers, **body.headers},
            )
        except trio.Cancelled:
            await self._abort(rid)
            raise
        except httpx.HTTPError as exc:
            self._stats["errors"] += 1
            await self._abort(rid)
            raise PolicyError(f"{where} failed: {type(exc).__name__}: {exc}") from exc
        try:
            out = self._decode(where, response)
        except PolicyError:
            self._stats["errors"] += 1
            raise
        self._stats["output_tokens"] += len(out.output_ids)
        return out

    def _decode(self, where: str, response: httpx.Response) -> PolicyOutput:
        if response.status_code >= 400:
            raise PolicyError(
                f"{where} answered HTTP {response.status_code}: {response.text[:300]}"
            )
        check = _Checker(where, self.vocab_size)
        try:
            if self.route == "generate":
                choice = _decode_generate(response.content).choices[0]
                content = choice.logprobs.content if choice.logprobs is not None else None
                if choice.token_ids is None or content is None:
                    raise PolicyError(f"{where}: the reply has no token_ids or no log-probs")
                ids = choice.token_ids
                if [e.token_id for e in content] != ids:
                    raise PolicyError(f"{where}: the log-probs' token ids are not the output's")
                log_probs: list[float | None] = [e.logprob for e in content]
            else:
                cchoice = _decode_completion(response.content).choices[0]
                if cchoice.token_ids is None or cchoice.logprobs is None:
                    raise PolicyError(f"{where}: the reply has no token_ids or no log-probs")
                ids, log_probs, choice_finish = (
                    cchoice.token_ids,
                    list(cchoice.logprobs.token_logprobs),
                    cchoice.finish_reason,
                )
                return check.output(ids, log_probs, _finish(choice_finish, True))
        except (msgspec.DecodeError, IndexError) as exc:
            raise PolicyError(f"{where} sent a malformed reply: {exc}") from exc
        return check.output(ids, log_probs, _finish(choice.finish_reason, True))

    async def generate_stream(
        self,
        input_ids: Sequence[int],
        sampling_params: Mapping[str, Any],
        *,
        on_tokens: Callable[[list[int]], Awaitable[None]],
        session_id: str | None = None,
    ) -> PolicyOutput:
        """See :meth:`~trio_swe.policy.StreamingPolicy.generate_stream`: the generate route
        with ``stream: true`` (server-sent events, each chunk the new ids and their log-probs).
        On the completions route, the whole output is handed over at once."""
        if self.route != "generate":
            out = await self.generate(input_ids, sampling_params, session_id=session_id)
            if out.output_ids:
                await on_tokens(list(out.output_ids))
            return out
        rid = f"trio-swe-{uuid.uuid4().hex}"
        where = self._where(rid)
        body = await self._body(rid, input_ids, sampling_params, stream=True)
        check = _Checker(where, self.vocab_size)
        self._stats["requests"] += 1
        ids: list[int] = []
        log_probs: list[float | None] = []
        finish: str | None = None
        done = False
        try:
            async with self._client.stream(
                "POST",
                f"{self.base_url}{self._path}",
                content=body,
                headers={**self._headers, **body.headers},
            ) as response:
                if response.status_code >= 400:
                    text = (await response.aread())[:300].decode(errors="replace")
                    done = True  # the server answered: nothing to abort
                    raise PolicyError(f"{where} answered HTTP {response.status_code}: {text}")
                async for line in response.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        done = True
                        break
                    try:
                        choice = _decode_generate(data).choices[0]
                    except (msgspec.DecodeError, IndexError) as exc:
                        raise PolicyError(f"{where} streamed a malformed chunk: {exc}") from exc
                    new = choice.token_ids or []
                    content = choice.logprobs.content if choice.logprobs is not None else []
                    content = content or []
                    if [e.token_id for e in content] != new:
                        raise PolicyError(f"{where}: a chunk's log-probs are not its ids'")
                    if choice.finish_reason is not None:
                        finish = choice.finish_reason
                    if new:
                        check.output(new, [e.logprob for e in content], "stop")
                        ids.extend(new)
                        log_probs.extend(e.logprob for e in content)
                        await on_tokens(list(new))
                if not done:
                    raise PolicyError(f"{where}: the stream ended without [DONE]")
        except httpx.HTTPError as exc:
            self._stats["errors"] += 1
            await self._abort(rid)
            raise PolicyError(f"{where} failed: {type(exc).__name__}: {exc}") from exc
        except PolicyError:
            self._stats["errors"] += 1
            if not done:
                await self._abort(rid)
            raise
        except BaseException:
            if not done:
                await self._abort(rid)
            raise
        self._stats["output_tokens"] += len(ids)
        return check.output(ids, log_probs, _finish(finish, True))

    async def _abort(self, rid: str) -> None:
        # Shielded and bounded: we are usually being cancelled ourselves. The server also
        # aborts a request whose connection closed; the explicit call covers a request that
        # is still queued behind a proxy that keeps the connection.
        self._stats["aborts"] += 1
        if self.route != "generate":
            return
        # Both names: the engine's, and ours for a server that keeps it.
        ids = [_GENERATE_ID_PREFIX + rid, rid]
        with trio.CancelScope(shield=True), trio.move_on_after(ABORT_TIMEOUT_SEC):
            try:
                await self._client.post(
                    f"{self.base_url}/inference/v1/abort_requests",
                    content=msgspec.json.encode({"request_ids": ids}),
                    headers=self._headers,
                )
            except httpx.HTTPError:
                pass

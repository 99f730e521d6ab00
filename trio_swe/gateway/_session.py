"""One episode's session: incoming histories matched to recorded turns, token-exact (sans-IO).

A session holds *chains*: conversations with the policy, each an append-only
:class:`~trio_swe.models.TokenHistory` and the turns recorded on it. A request is placed by
matching its messages against each chain's *transcript* (the messages as the client sent them
plus our replies as we sent them):

* every message up to the chain's last reply matches: the request continues the chain; only
  the messages after that reply (tool results, a user message) are rendered and tokenized,
  and the prompt is the chain's tokens (sampled ids kept as sampled) + that delta;
* it matches up to an earlier reply, or diverges after one (the client rewrote or dropped
  history: compaction, a retry of an answered request): a new chain starts from the matched
  messages (our own parsed replies for those turns) + the client's rest, rendered whole. Fed
  to the sample builder after the first chain, it is a FORK (its ``turn_kinds`` say so);
* it matches nothing: a new chain.

A message the client resends as it was is the very object of its previous parse (the
gateway parses through the session's :attr:`Session.parse_memo`), which the transcript holds:
those are matched by identity, in C, and only the rest is compared.

Clients do not replay our replies faithfully, so a reply is recognised by the reference we
embed in the ids we hand out (tool-call ids, thinking signatures, ``encrypted_content``) or,
failing that, by its text and tool names with arguments compared as JSON values where the
client may add keys with default values (Claude Code's ``"replace_all": false``) or re-serialise
them (Qwen Code, opencode).

Requests without tools (opencode's title request) are *side* chains: served and counted, but
not part of the episode's turns (they would mix an unrelated conversation into its samples).
"""

from __future__ import annotations

import operator
from array import array
from collections.abc import Callable, Mapping, Sequence
from itertools import compress, count, islice
from typing import Any

import msgspec

from .._errors import ConfigError, TokenLimitError
from .._json import loads
from ..models import ChatModel, NotAppendOnlyError, TokenHistory
from ..policy import PolicyOutput
from ..trajectory import TurnRecord, TurnRecorder
from ._common import (
    ApiError,
    Conversation,
    Message,
    ParseMemo,
    Reply,
    ReplyToolCall,
    call_id,
    new_ref,
)

__all__ = ["Draft", "Pending", "Placement", "Session", "SessionStatistics"]

#: Default cap of one turn's sampled tokens when the trainer's params name none.
DEFAULT_MAX_NEW_TOKENS = 4096


class SessionStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """Counters of one session.

    Attributes:
        requests: requests placed (served or refused for overflow).
        turns: turns recorded on the episode's chains.
        side_turns: turns recorded on side chains (requests without tools).
        chains: chains started (side chains included).
        forks: chains of the episode started after its first (a branch off a reply, a
            dropped reply, a compaction): each starts a new sample in the sample builder
            (turn kind ``fork``; the builder may instead ``realign`` a branch whose prompt
            diverges inside the last response). Side chains are not counted.
        appended: requests that continued a chain by an append-only delta.
        delta_tokens: tokens rendered for those deltas.
        rendered_tokens: tokens rendered for the first prompts of chains.
        ill_formed: turns whose output did not parse.
        overflows: requests refused because the prompt filled the context.
        failed: prepared requests that were never committed (policy error, disconnect).
        tool_calls: tool calls in the replies recorded on the episode's chains.
        policy_sec: time spent waiting for the policy.
        parsed_messages: the API's messages (Responses: input items) of the session's
            requests that were parsed (``count_tokens`` included).
        reused_messages: those resent as they were in the previous request of their kind,
            whose parse was reused (:class:`~trio_swe.gateway._common.ParseMemo`): a CLI that
            resends its history has all but its new messages here.
    """

    requests: int = 0
    turns: int = 0
    side_turns: int = 0
    chains: int = 0
    forks: int = 0
    appended: int = 0
    delta_tokens: int = 0
    rendered_tokens: int = 0
    ill_formed: int = 0
    overflows: int = 0
    failed: int = 0
    tool_calls: int = 0
    policy_sec: float = 0.0
    parsed_messages: int = 0
    reused_messages: int = 0


class _Chain:
    __slots__ = ("boundaries", "history", "index", "recorder", "side", "transcript", "turns")

    def __init__(
        self,
        index: int,
        history: TokenHistory,
        transcript: list[Message],
        side: bool,
        recorder: TurnRecorder,
    ) -> None:
        self.index = index
        self.history = history  # after the last output: awaiting the next delta
        self.transcript = transcript  # client-form messages, our replies included
        self.boundaries: list[int] = []  # len(transcript) after each reply
        self.turns: list[TurnRecord] = []
        # The turns' records share one history: each turn copies only its new tokens.
        self.recorder = recorder
        self.side = side


def _turn_of(
    recorder: TurnRecorder,
    ids: array[int],
    prompt_tokens: int,
    *,
    log_probs: list[float] | None,
    finish_reason: str,
    ill_formed: bool,
) -> TurnRecord:
    """The record of a turn whose prompt is ``ids[:prompt_tokens]`` and output the rest of
    ``ids`` (a history after ``append_output``). The ids are viewed, not converted: the
    recorder compares the part it holds (one memcmp) and copies the new tokens, so a turn
    costs O(its delta), not a conversion of the whole history."""
    view = memoryview(ids)
    return recorder.record(
        prompt_ids=view[:prompt_tokens],
        output_ids=view[prompt_tokens:],
        output_log_probs=log_probs,
        finish_reason=finish_reason,
        ill_formed=ill_formed,
    )


class Pending(msgspec.Struct, kw_only=True):
    """A request placed and ready for the policy.

    Attributes:
        prompt_ids: the prompt (the chain's tokens + the delta).
        max_new_tokens: the cap of this turn (trainer's, client's and the context's room).
        sampling_params: what the policy is called with.
        overflow: the prompt leaves no room in the context: do not call the policy.
    """

    prompt_ids: Any
    max_new_tokens: int
    sampling_params: dict[str, Any]
    overflow: bool = False
    #: With ``overflow``: the prompt's length in tokens, or a lower bound of it when the
    #: request was refused before it was tokenized whole.
    overflow_tokens: int = 0
    conversation: Conversation | None = None
    history: Any = None
    chain: Any = None  # the chain continued, or None for a new one
    transcript: list[Message] = msgspec.field(default_factory=list)
    forked: bool = False
    side: bool = False
    tip: int = 0  # the chain's turn count when placed (another request may extend it first)
    delta_tokens: int = 0
    rendered_tokens: int = 0


class Placement(msgspec.Struct, kw_only=True):
    """Where :meth:`Session.place` put a request, and what :meth:`Session.build` reads of it."""

    conversation: Conversation
    side: bool
    chain: Any = None  # the best-matching chain, or None
    matched: int = 0  # leading messages of the request that match its transcript
    history: Any = None  # the chain's history when placed
    transcript_length: int = 0
    boundaries: tuple[int, ...] = ()
    request: int = 0  # the request's index in the session (a seeded session's seed offset)


class Draft(msgspec.Struct, kw_only=True):
    """A policy output made into a reply, not yet recorded (:meth:`Session.commit` makes its
    turn, on the chain it lands on)."""

    pending: Pending
    reply: Reply
    message: Message
    output: PolicyOutput
    prompt_tokens: int  # the prompt's length: the history's ids after it are the output
    ill_formed: bool = False


def _args_match(recorded: Any, incoming: Any) -> bool:
    """Arguments ``incoming`` (as the client replays them) say what ``recorded`` said: equal as
    JSON values, where the client may have added keys set to a default (false/None/""/0/[])."""
    if recorded == incoming:
        return True
    if isinstance(incoming, str):
        try:
            incoming = loads(incoming)
        except ValueError:
            return False
    if not isinstance(recorded, dict) or not isinstance(incoming, dict):
        return bool(recorded == incoming)
    for key, value in recorded.items():
        if key not in incoming or incoming[key] != value:
            return False
    return all(
        incoming[k] in (False, None, "", 0, [], {}) for k in incoming.keys() - recorded.keys()
    )


def _same_reply(ours: Message, theirs: Message) -> bool:
    if theirs.role != "assistant":
        return False
    if theirs.ref:
        return theirs.ref == ours.ref
    if theirs.content.strip() != ours.content.strip():
        return False
    if len(theirs.tool_calls) != len(ours.tool_calls):
        return False
    return all(
        a[1] == b[1] and _args_match(a[2], b[2])
        for a, b in zip(ours.tool_calls, theirs.tool_calls, strict=True)
    )


def _same_message(ours: Message, theirs: Message) -> bool:
    if ours is theirs:  # a message the parse memo gave again (the relation is reflexive)
        return True
    if ours.role == "assistant" and ours.ref:
        return _same_reply(ours, theirs)
    if ours.role != theirs.role or ours.content != theirs.content:
        return False
    if ours.role == "tool":
        return ours.tool_call_id == theirs.tool_call_id
    if ours.role == "assistant":  # a foreign assistant message (not ours), e.g. a primer
        return _same_reply(ours, theirs)
    return True


def _matched(transcript: Sequence[Message], incoming: Sequence[Message]) -> int:
    """How many leading messages of ``incoming`` match ``transcript``.

    The leading messages that are the transcript's own objects (the parse memo gives a
    resent message's earlier parse, which the transcript holds) are skipped in C; the
    comparisons start at the first other one (typically our last reply as the client
    replays it)."""
    n = next(
        compress(count(), map(operator.is_not, transcript, incoming)),
        min(len(transcript), len(incoming)),
    )
    rest = zip(islice(transcript, n, None), islice(incoming, n, None), strict=False)
    for ours, theirs in rest:
        if not _same_message(ours, theirs):
            break
        n += 1
    return n


class Session:
    """The recording state of one episode (sans-IO; the gateway does the policy call).

    Args:
        session_id: the episode's id (the policy's routing key).
        model_for: the chat model for a list of tools (cached by the gateway).
        sampling_params: the trainer's SGLang sampling parameters (the client's ``temperature``
            and such are ignored; its ``max_tokens`` may only lower ``max_new_tokens``).
        max_context_tokens: prompt + output cap (0: none); a prompt that fills it is refused
            with the API's context-length error and recorded as a truncated turn.
        max_turns: requests refused (429-like ``overloaded``) past this many turns.
        max_prompt_tokens: a cap of any prompt (0: none), besides ``max_context_tokens``: the
            gateway's bound of the work one request may cause. A prompt over either is
            refused as a context overflow as soon as that is known: before rendering when its
            messages' text alone is too long, else after the piece of tokenizing that passes it.
        keep_sampled: a user or system message that continues a chain is appended to its
            tokens even where the chat template would re-render earlier turns (Qwen3 drops
            their reasoning once a user message follows): the cost of a request is its new
            messages', and the chain stays one sample. False: such a request forks, its whole
            conversation rendered as the template would (O(history) per request).
    """

    def __init__(
        self,
        session_id: str,
        *,
        model_for: Callable[[Sequence[Mapping[str, Any]]], ChatModel],
        sampling_params: Mapping[str, Any] | None = None,
        max_context_tokens: int = 0,
        max_turns: int = 1000,
        max_prompt_tokens: int = 0,
        keep_sampled: bool = True,
    ) -> None:
        self.session_id = session_id
        self.keep_sampled = keep_sampled
        caps = [
            c
            for c in (max_context_tokens - 1 if max_context_tokens else 0, max_prompt_tokens)
            if c > 0
        ]
        #: The longest prompt served (None: any); one over it is an overflow.
        self.prompt_cap: int | None = min(caps) if caps else None
        #: The maximum an overflow's error names (the context, else the prompt cap).
        self.context_limit = (
            max_context_tokens
            if max_context_tokens and self.prompt_cap == max_context_tokens - 1
            else (self.prompt_cap or 0)
        )
        self._model_for = model_for
        self.sampling_params = dict(sampling_params or {})
        self.max_context_tokens = max_context_tokens
        self.max_turns = max_turns
        self._chains: list[_Chain] = []
        self._order: list[tuple[int, int]] = []  # (chain, turn) in the order they were recorded
        self._stats: dict[str, Any] = dict.fromkeys(SessionStatistics.__struct_fields__, 0)
        self._stats["policy_sec"] = 0.0
        #: What the session's requests parsed to (the gateway passes it to ``parse_request``;
        #: cleared when the session finishes).
        self.parse_memo = ParseMemo()

    # -- placing a request ----------------------------------------------------------------

    def prepare(self, conv: Conversation) -> Pending:
        """Place ``conv`` on a chain and build its prompt; nothing is recorded yet.

        :meth:`place`, :meth:`build` and :meth:`count` in one call (the gateway runs
        :meth:`build`, the rendering and tokenizing, in a worker thread).

        Raises:
            ApiError: the chat template cannot render the tools or messages (400), or the
                session is over its turn limit.
        """
        pending = self.build(self.place(conv))
        self.count(pending)
        return pending

    def place(self, conv: Conversation) -> Placement:
        """Match ``conv``'s history against the chains (cheap: comparisons, no tokenizing).

        Raises:
            ApiError: the session is over its turn limit (429).
        """
        if self._stats["turns"] + self._stats["side_turns"] >= self.max_turns:
            raise ApiError(429, "overloaded", f"session {self.session_id!r}: turn limit reached")
        self._stats["requests"] += 1
        side = not conv.tools
        best: _Chain | None = None
        best_n = 0
        for chain in self._chains:
            if chain.side != side or not chain.boundaries:
                continue
            n = _matched(chain.transcript, conv.messages)
            if n > best_n or (n == best_n and best is not None and n > 0):
                best, best_n = chain, n
        # What build() reads of the chain, taken now: a chain's history and transcript are
        # replaced (never changed in place) when a turn is recorded, so this stays whole
        # while build() runs in a worker thread.
        request = self._stats["requests"] - 1
        if best is None:
            return Placement(conversation=conv, side=side, request=request)
        return Placement(
            conversation=conv,
            side=side,
            request=request,
            chain=best,
            matched=best_n,
            history=best.history,
            transcript_length=len(best.transcript),
            boundaries=tuple(best.boundaries),
        )

    def build(self, placement: Placement) -> Pending:
        """Render and tokenize the prompt of a placed request: the chain's tokens + the delta
        of the new messages, or a new chain rendered whole. Touches no session state, so it
        may run in a worker thread (the gateway's tokenizing threads).

        Raises:
            ApiError: the chat template cannot render the tools or messages (400).
        """
        try:
            return self._build(placement)
        except TokenLimitError as exc:
            # Refused before the prompt was tokenized whole: the chain's tokens so far stand
            # for the prompt (what follows them would be cut by the context anyway).
            conv, best = placement.conversation, placement.chain
            continued = best is not None and placement.matched == placement.transcript_length
            pending = Pending(
                prompt_ids=placement.history.ids if continued else [],
                max_new_tokens=0,
                sampling_params={},
                overflow=True,
                overflow_tokens=exc.tokens,
                conversation=conv,
                history=placement.history if continued else None,
                chain=best if continued else None,
                transcript=list(conv.messages),
                side=placement.side,
                tip=len(placement.boundaries),
            )
            return pending

    def _build(self, placement: Placement) -> Pending:
        conv, side, best = placement.conversation, placement.side, placement.chain
        best_n, boundaries = placement.matched, placement.boundaries
        incoming = conv.messages
        cap = self.prompt_cap
        try:
            model = self._model_for(conv.tools)
            if (
                best is not None
                and best_n == placement.transcript_length
                and boundaries[-1] == best_n
            ):
                new = incoming[best_n:]
                if new:
                    try:
                        history = placement.history.copy()
                        before = len(history.ids)
                        history.append_messages(
                            [m.template_dict() for m in new],
                            max_tokens=cap,
                            keep_sampled=self.keep_sampled,
                        )
                        pending = self._pending(
                            conv,
                            history,
                            chain=best,
                            side=side,
                            tip=len(boundaries),
                            request=placement.request,
                        )
                        pending.delta_tokens = len(history.ids) - before
                        return pending
                    except NotAppendOnlyError:
                        pass  # the template re-renders earlier turns: fork below
            # A new chain: the matched part of the best chain (our own parsed replies) and the
            # client's rest, rendered whole.
            k = 0
            if best is not None and best_n > 0:
                k = max((b for b in boundaries if b <= best_n), default=0)
            forked = k > 0
            prefix: list[dict[str, Any]] = []
            if k:
                # The history's messages are aligned with the transcript, one for one.
                prefix = [dict(m) for m in placement.history.messages[:k]]
            rest = incoming[k:]
            messages = prefix + [m.template_dict() for m in rest]
            history = model.start(messages, max_tokens=cap)
        except ConfigError as exc:  # tools or messages the chat template cannot render
            raise ApiError(400, "invalid_request", str(exc)) from exc
        pending = self._pending(
            conv, history, chain=None, side=side, forked=forked, request=placement.request
        )
        pending.rendered_tokens = len(history.ids)
        return pending

    def count(self, pending: Pending) -> None:
        """Count the tokens :meth:`build` rendered (on the session's own thread)."""
        if pending.chain is not None:
            self._stats["delta_tokens"] += pending.delta_tokens
        self._stats["rendered_tokens"] += pending.rendered_tokens

    def _pending(
        self,
        conv: Conversation,
        history: TokenHistory,
        *,
        chain: _Chain | None,
        side: bool,
        forked: bool = False,
        tip: int = 0,
        request: int = 0,
    ) -> Pending:
        params = dict(self.sampling_params)
        cap = int(params.get("max_new_tokens") or DEFAULT_MAX_NEW_TOKENS)
        if conv.max_tokens is not None:
            cap = min(cap, conv.max_tokens)
        prompt = history.ids
        overflow = self.prompt_cap is not None and len(prompt) > self.prompt_cap
        if self.max_context_tokens:
            room = self.max_context_tokens - len(prompt)
            cap = max(min(cap, room), 0)
        params["max_new_tokens"] = cap
        if params.get("seed") is not None:  # no two requests of a session share a seed
            params["seed"] = int(params["seed"]) + request
        params.setdefault("skip_special_tokens", False)
        params.setdefault("no_stop_trim", True)
        return Pending(
            prompt_ids=prompt,
            max_new_tokens=cap,
            sampling_params=params,
            overflow=overflow,
            overflow_tokens=len(prompt),
            conversation=conv,
            history=history,
            chain=chain,
            transcript=list(conv.messages),
            forked=forked,
            side=side,
            tip=tip,
        )

    # -- recording ------------------------------------------------------------------------

    def draft(
        self, pending: Pending, output: PolicyOutput, *, model_name: str = "", ref: str = ""
    ) -> Draft:
        """Parse the policy's output for ``pending`` and build the reply; nothing is recorded
        until :meth:`commit` (call it once the reply reached the client).

        An output whose tool call does not parse is ``ill_formed`` and answered as plain text
        (an output that calls no tool is a plain answer: CLI agents end their runs so).
        """
        history: TokenHistory = pending.history
        conv = pending.conversation
        assert conv is not None
        prompt_tokens = len(history.ids)
        ill_formed = False
        ref = ref or new_ref()  # given when the reply's ids went out before the output ended
        prefix = "toolu_" if conv.api == "anthropic" else "call_"
        text: str = ""
        reasoning: str | None = None
        calls: tuple[ReplyToolCall, ...] = ()
        if output.output_ids:
            parsed = history.model.parse(output.output_ids)
            if parsed.ill_formed and not parsed.error.startswith("no tool call"):
                ill_formed = True
                text = parsed.text
            else:
                text, reasoning = parsed.content, parsed.reasoning
                calls = tuple(
                    ReplyToolCall(call_id(prefix, ref, i), c.name, dict(c.arguments))
                    for i, c in enumerate(parsed.tool_calls)
                )
            history.append_output(output.output_ids, parsed)
        finish: Any = (
            "length" if output.finish_reason == "length" else ("tool_calls" if calls else "stop")
        )
        reply = Reply(
            ref=ref,
            text=text,
            reasoning=reasoning,
            tool_calls=calls,
            finish=finish,
            input_tokens=prompt_tokens,
            output_tokens=len(output.output_ids),
            model=model_name or conv.model,
        )
        ours = Message(
            role="assistant",
            content=text,
            reasoning=reasoning,
            tool_calls=[(c.id, c.name, c.arguments) for c in calls],
            ref=ref,
        )
        return Draft(
            pending=pending,
            reply=reply,
            message=ours,
            output=output,
            prompt_tokens=prompt_tokens,
            ill_formed=ill_formed,
        )

    def commit(self, draft: Draft) -> None:
        """Record a drafted turn (its reply was delivered).

        Raises:
            InvalidArgumentError: the policy's output does not make a valid record (log-probs
                not one per output id); nothing is recorded.
        """
        self._record(draft)
        if draft.ill_formed:
            self._stats["ill_formed"] += 1
        if not draft.pending.side:
            self._stats["tool_calls"] += len(draft.reply.tool_calls)

    def add_policy_time(self, seconds: float) -> None:
        """Count time spent waiting for the policy (the gateway measures it)."""
        self._stats["policy_sec"] += seconds

    def record_overflow(self, pending: Pending) -> None:
        """Record a refused, overflowing request as a turn with no output (``length``), so the
        episode's sample is marked truncated, not lost. (A first prompt refused before it
        was tokenized records nothing: there is no sampled turn to keep.)"""
        self._stats["overflows"] += 1
        if pending.history is None:
            return
        ids = pending.history.ids
        recorder = self._recorder_for(pending)
        turn = _turn_of(
            recorder, ids, len(ids), log_probs=None, finish_reason="length", ill_formed=False
        )
        self._append_turn(self._chain_for(pending, recorder), turn)
        # The chain's history is left as it was: the client will not continue from here.

    def abandon(self, pending: Pending) -> None:
        """Count a prepared request that was never committed (nothing was recorded)."""
        self._stats["failed"] += 1

    def _recorder_for(self, pending: Pending) -> TurnRecorder:
        """The recorder of the chain :meth:`_chain_for` will put ``pending`` on (a new one
        for a new chain), chosen without changing anything."""
        chain: _Chain | None = pending.chain
        if chain is not None and len(chain.boundaries) == pending.tip:
            return chain.recorder
        return TurnRecorder()

    def _chain_for(self, pending: Pending, recorder: TurnRecorder) -> _Chain:
        chain: _Chain | None = pending.chain
        if chain is not None and len(chain.boundaries) != pending.tip:
            # A concurrent request extended this chain first: this one branches off it.
            chain, pending.chain, pending.forked = None, None, True
        if chain is None:
            # Any chain of the episode after its first starts a new sample in the builder
            # (turn kind "fork"), whether it branched off a reply or matched nothing (a CLI
            # that dropped our reply, a compaction): count it so.
            later = not pending.side and any(not c.side for c in self._chains)
            chain = _Chain(len(self._chains), pending.history, [], pending.side, recorder)
            self._chains.append(chain)
            self._stats["chains"] += 1
            if pending.forked or later:
                self._stats["forks"] += 1
            pending.chain = chain
        return chain

    def _record(self, draft: Draft) -> None:
        pending, ours, output = draft.pending, draft.message, draft.output
        continued = pending.chain is not None
        # Made here, on the session's thread and in commit order (drafts run in worker
        # threads; a draft never committed leaves the recorder as it was), before anything
        # changes: a record that cannot be made (it raises) records nothing.
        recorder = self._recorder_for(pending)
        turn = _turn_of(
            recorder,
            pending.history.ids,
            draft.prompt_tokens,
            log_probs=output.log_probs,
            finish_reason=output.finish_reason,
            ill_formed=draft.ill_formed,
        )
        chain = self._chain_for(pending, recorder)
        if continued and pending.chain is chain:
            self._stats["appended"] += 1
        chain.history = pending.history
        chain.transcript = [*pending.transcript, ours]
        # Keep the history's messages aligned with the transcript (one per message).
        chain.boundaries.append(len(chain.transcript))
        self._append_turn(chain, turn)

    def _append_turn(self, chain: _Chain, turn: TurnRecord) -> None:
        """Put ``turn`` at the end of ``chain`` and of the session's order, and count it."""
        chain.turns.append(turn)
        self._order.append((chain.index, len(chain.turns) - 1))
        if chain.side:
            self._stats["side_turns"] += 1
        else:
            self._stats["turns"] += 1

    # -- results --------------------------------------------------------------------------

    def turns(self, *, side: bool = False) -> list[TurnRecord]:
        """The recorded turns, chain after chain (each chain's in order): what the sample
        builder takes, a new chain starting a new sample. Side chains only with ``side``."""
        out: list[TurnRecord] = []
        for chain in self._chains:
            if chain.side == side:
                out.extend(chain.turns)
        return out

    def conversations(self, *, side: bool = False) -> list[list[dict[str, Any]]]:
        """Each chain's messages as its chat template rendered them (our replies as parsed,
        the client's other messages as it sent them), chain after chain; side chains only
        with ``side``."""
        return [[dict(m) for m in c.history.messages] for c in self._chains if c.side == side]

    def tools(self, *, side: bool = False) -> list[list[dict[str, Any]]]:
        """Each chain's tools as declared to its chat template (as :meth:`conversations`)."""
        return [list(c.history.model.tools) for c in self._chains if c.side == side]

    def statistics(self) -> SessionStatistics:
        """See :class:`SessionStatistics`."""
        stats = dict(self._stats)
        stats["parsed_messages"] = self.parse_memo.parsed
        stats["reused_messages"] = self.parse_memo.reused
        return SessionStatistics(**stats)

"""Per-episode trajectories: an episode's turns read back from its samples, one JSON per episode.

A results file keeps what training needs: each sample's tokens, loss mask and rollout log-probs.
The turns are in there: the prompt region is the first prompt; in the response region, each run
of sampled tokens (loss 1, or a masked output that still carries its log-probs) is one policy
output, and each run of context between them is what the agent appended (the tool's output and
the template's role headers). :func:`episode_messages` splits a sample that way (sans-IO; text
and tool calls when given a :class:`TurnText`), :func:`episode_trajectory` adds the outcome as
mini-swe-agent and SWE-agent keep it (``info``: status, reward, submission, timings), and
:class:`TrajectoryWriter` writes one ``<episode>.traj.json`` per episode (``trio-swe run
--trajectories DIR``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from typing import Any, Literal, Protocol

import msgspec

from .episode import EpisodeResult
from .trajectory import Sample

__all__ = [
    "TRAJECTORY_FORMAT",
    "Message",
    "TrajectoryWriter",
    "TurnText",
    "episode_messages",
    "episode_trajectory",
    "load_turn_text",
    "trajectory_file_name",
]

#: The ``trajectory_format`` of the files :class:`TrajectoryWriter` writes.
TRAJECTORY_FORMAT = "trio-swe-1"

Role = Literal["prompt", "assistant", "observation"]


class TurnText(Protocol):
    """Token ids to text, and a policy output's tool calls: the run's tokenizer and dialect."""

    def decode(self, ids: Sequence[int]) -> str:
        """The text of ``ids`` (special tokens kept)."""
        ...

    def tool_calls(self, text: str) -> list[dict[str, Any]]:
        """The calls in one decoded output (``{"name": ..., "arguments": {...}}`` each)."""
        ...


class Message(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One stretch of an episode's tokens.

    Attributes:
        role: ``prompt`` (a sample's prompt region), ``assistant`` (one policy output) or
            ``observation`` (context the agent appended between two outputs: tool output,
            role headers).
        sample: the index of the sample it comes from (a forked chain has several).
        turn: for ``assistant``, the index of the policy call in the episode (from 0).
        token_ids: its token ids.
        text: the decoded text, when a tokenizer was given.
        loss_mask: for ``assistant``, one 0/1 per token (0: an ill-formed output kept as context).
        log_probs: for ``assistant``, the rollout log-prob of each token.
        tool_calls: for ``assistant`` with a tokenizer, the calls it made.
        kind: for ``assistant``, how the sample builder placed the turn (``start``, ``clean``,
            ``realign``, ``fork``) when the sample's metadata says it.
    """

    role: Role
    sample: int
    token_ids: list[int]
    turn: int | None = None
    text: str | None = None
    loss_mask: list[int] | None = None
    log_probs: list[float] | None = None
    tool_calls: list[dict[str, Any]] | None = None
    kind: str | None = None


def _spans(sample: Sample) -> list[tuple[bool, int, int]]:
    """The response region as runs: (sampled, start, end) in token positions of the sample.

    A token is sampled when it is trained (mask 1) or carries a log-prob (a masked ill-formed
    output keeps its log-probs; context has 0.0). A sampled token whose log-prob is exactly 0.0
    and whose mask is 0 reads as context: the split is then one token off, the tokens are not.
    """
    base = sample.prompt_length
    mask = sample.loss_mask.tobytes()
    lps = sample.rollout_log_probs
    runs: list[tuple[bool, int, int]] = []
    for i in range(sample.response_length):
        sampled = mask[i] == 1 or lps[i] != 0.0
        if runs and runs[-1][0] == sampled:
            runs[-1] = (sampled, runs[-1][1], base + i + 1)
        else:
            runs.append((sampled, base + i, base + i + 1))
    return runs


def episode_messages(result: EpisodeResult, text: TurnText | None = None) -> list[Message]:
    """The episode's samples as messages, in order: each sample's prompt, then its outputs and
    the observations between them. With ``text``, each message carries its decoded text and
    each output its tool calls; without, token ids only.

    An episode with no samples (aborted, an agent that records no turns, a run without samples)
    has no messages. A truncated sample ends where it was cut.
    """
    messages: list[Message] = []
    turn = 0
    for s_index, sample in enumerate(result.samples):
        tokens = sample.tokens
        info = sample.metadata.get("trajectory")
        kinds = info.get("turn_kinds") if isinstance(info, dict) else None
        mask = sample.loss_mask
        lps = sample.rollout_log_probs
        base = sample.prompt_length
        prompt = tokens[:base].tolist()
        messages.append(
            Message(
                role="prompt",
                sample=s_index,
                token_ids=prompt,
                text=text.decode(prompt) if text is not None else None,
            )
        )
        s_turn = 0
        for sampled, start, end in _spans(sample):
            ids = tokens[start:end].tolist()
            decoded = text.decode(ids) if text is not None else None
            if not sampled:
                messages.append(
                    Message(role="observation", sample=s_index, token_ids=ids, text=decoded)
                )
                continue
            kind = kinds[s_turn] if isinstance(kinds, list) and s_turn < len(kinds) else None
            messages.append(
                Message(
                    role="assistant",
                    sample=s_index,
                    turn=turn,
                    token_ids=ids,
                    text=decoded,
                    loss_mask=mask[start - base : end - base].tolist(),
                    log_probs=[round(x, 4) for x in lps[start - base : end - base].tolist()],
                    tool_calls=(
                        text.tool_calls(decoded)
                        if text is not None and decoded is not None
                        else None
                    ),
                    kind=str(kind) if kind is not None else None,
                )
            )
            turn += 1
            s_turn += 1
    return messages


def episode_trajectory(result: EpisodeResult, text: TurnText | None = None) -> dict[str, Any]:
    """One episode as a trajectory document: its identity, ``info`` (the outcome: status, abort
    reason and error, reward, grading, the patch as ``submission``, per-phase ``timings``) and
    ``messages`` (:func:`episode_messages`), JSON-ready."""
    ev = result.eval_result
    info: dict[str, Any] = {
        "status": result.status,
        "abort_reason": result.abort_reason,
        "error": result.error,
        "reward": result.reward,
        "resolved": ev.resolved if ev is not None else None,
        "eval_reason": ev.reason if ev is not None else None,
        "eval_detail": ev.detail if ev is not None else None,
        "agent_exit_code": result.agent_exit_code,
        "agent_finish": result.agent_finish,
        "n_turns": result.n_turns,
        "n_samples": len(result.samples),
        "started_at": result.started_at,
        "timings": msgspec.to_builtins(result.timings),
        "boot_attempts": result.boot_attempts,
        "boot_retries": result.boot_retries,
        "base_commit": result.base_commit,
        "submission": result.patch_text,
        "agent_output": result.agent_output,
    }
    doc: dict[str, Any] = {
        "trajectory_format": TRAJECTORY_FORMAT,
        "instance_id": result.instance_id,
        "episode_id": result.episode_id,
        "protocol": result.protocol,
    }
    if result.group_id:  # GRPO groups
        doc["group_id"] = result.group_id
        doc["group_index"] = result.group_index
        doc["seed"] = result.seed
    doc["info"] = info
    doc["messages"] = msgspec.to_builtins(episode_messages(result, text))
    return doc


_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def trajectory_file_name(result: EpisodeResult) -> str:
    """``<episode id>.traj.json``, every character outside ``[A-Za-z0-9._-]`` replaced by ``_``
    (episode ids are ``<instance>#<hex>``; an instance id may hold ``/``)."""
    name = _UNSAFE.sub("_", result.episode_id).lstrip(".") or "episode"
    return f"{name[:200]}.traj.json"


class TrajectoryWriter:
    """Writes one trajectory file per episode into ``directory`` (created if missing).

    Each file is written whole, then renamed into place, so a killed run leaves whole files
    only. Call it with each result as it arrives (``trio-swe run``'s ``on_result``).
    """

    def __init__(self, directory: str | os.PathLike[str], text: TurnText | None = None) -> None:
        self.directory = os.fspath(directory)
        self.text = text
        self.written = 0
        os.makedirs(self.directory, exist_ok=True)

    def write(self, result: EpisodeResult) -> str:
        """Write ``result``'s trajectory; returns the file's path."""
        path = os.path.join(self.directory, trajectory_file_name(result))
        tmp = f"{path}.tmp-{os.getpid()}"
        with open(tmp, "wb") as f:
            f.write(msgspec.json.format(msgspec.json.encode(episode_trajectory(result, self.text))))
        os.replace(tmp, path)
        self.written += 1
        return path

    __call__ = write


# --- the run's tokenizer -----------------------------------------------------------------------


class _TextDialect:
    """A plain tokenizer (the byte tokenizer of the demo and of runs without SWE_TOKENIZER):
    the bash agent's text dialect, one ```bash block per output."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def decode(self, ids: Sequence[int]) -> str:
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=False))

    def tool_calls(self, text: str) -> list[dict[str, Any]]:
        from .agents._bash_agent import parse_command

        command = parse_command(text)
        return [] if command is None else [{"name": "bash", "arguments": {"command": command}}]


class _ToolDialect:
    """A checkpoint's tokenizer and chat template: its tool-call parser reads the calls."""

    def __init__(self, model: Any) -> None:
        self.model = model

    def decode(self, ids: Sequence[int]) -> str:
        return str(self.model.decode(ids))

    def tool_calls(self, text: str) -> list[dict[str, Any]]:
        parsed = self.model.parse(text)
        return [{"name": c.name, "arguments": c.arguments} for c in parsed.tool_calls]


def load_turn_text(spec: str, *, tool_parser: str = "auto") -> TurnText:
    """The run's tokenizer: ``bytes`` for the byte tokenizer (``trio-swe demo``, runs without
    ``SWE_TOKENIZER``), else a checkpoint folder (its chat template's tool-call parser reads the
    calls; ``tool_parser`` names it, as ``SWE_TOOL_PARSER`` does; a tokenizer without a template
    decodes, and ```bash blocks are read as calls).

    Raises:
        ConfigError: the folder holds no tokenizer (names the path).
    """
    if spec == "bytes":
        from .policy import ByteTokenizer

        return _TextDialect(ByteTokenizer())
    from .agents._bash_agent import BashAgent
    from .models import ChatModel, TemplateError, load_tokenizer

    tokenizer = load_tokenizer(spec, require_chat_template=False)
    if getattr(tokenizer, "chat_template", None):
        try:
            model = ChatModel(tokenizer, tools=BashAgent.TOOLS, tool_parser=tool_parser, name=spec)
            return _ToolDialect(model)
        except TemplateError:
            pass  # a template without tool calls: the text dialect's blocks
    return _TextDialect(tokenizer)

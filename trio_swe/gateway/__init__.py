"""The recording gateway: CLI coding agents talk to it as to their model's API, it calls the
policy with token ids and records every turn token-exact.

Three APIs, for the clients that speak them: Anthropic Messages (``POST /v1/messages``, Claude
Code), OpenAI Responses (``POST /v1/responses``, Codex) and OpenAI Chat Completions
(``POST /v1/chat/completions``, Qwen Code, opencode, mini-swe-agent), streamed (SSE) or not.
Each episode gets a session, named by the API key its agent is given::

    async with open_gateway(policy, tokenizer) as gateway:
        async with gateway.session(episode_id, sampling_params=params) as session:
            ...  # run the CLI with base URL gateway.url and API key session.api_key
        turns = session.turns()       # TurnRecords for the sample builder

Needs the ``gateway`` extra (hypercorn) and a tokenizer with a chat template (``hf`` extra).
"""

from __future__ import annotations

from ._common import ApiError, Conversation, Message, Reply, ReplyToolCall
from ._server import Gateway, GatewaySession, GatewayStatistics, open_gateway
from ._session import Session, SessionStatistics

__all__ = [
    "ApiError",
    "Conversation",
    "Gateway",
    "GatewaySession",
    "GatewayStatistics",
    "Message",
    "Reply",
    "ReplyToolCall",
    "Session",
    "SessionStatistics",
    "open_gateway",
]

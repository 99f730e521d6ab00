"""What every HTTP policy client shares: its httpx client (owned or lent), headers, sampling
defaults, counters, ``aclose`` and ``statistics``. The engines' dialects live in their modules."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import httpx
import trio

from ._types import PolicyStatistics

__all__ = ["HttpPolicy"]


class HttpPolicy(trio.abc.AsyncResource):
    """Base of :class:`~trio_swe.policy.SGLangPolicy` and :class:`~trio_swe.policy.VLLMPolicy`."""

    def __init__(
        self,
        base_url: str,
        *,
        client: httpx.AsyncClient | None,
        read_timeout_sec: float | None,
        headers: Mapping[str, str],
        defaults: Mapping[str, Any] | None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._own_client = client is None
        # No read or pool timeout by default: a generation may take long, and waiting for a
        # free connection is bounded by the caller's budget (a cancel scope), not a constant.
        self._client = client or httpx.AsyncClient(
            timeout=httpx.Timeout(10.0, read=read_timeout_sec, pool=None),
            limits=httpx.Limits(max_connections=256, max_keepalive_connections=64),
        )
        self._headers = dict(headers)
        #: Sampling parameters (SGLang's names) under each call's own.
        self.defaults = dict(defaults or {})
        self._stats = {"requests": 0, "aborts": 0, "errors": 0, "output_tokens": 0}

    async def aclose(self) -> None:
        """Close the HTTP client if this object created it."""
        if self._own_client:
            await self._client.aclose()

    def statistics(self) -> PolicyStatistics:
        """Requests sent, aborts sent, errors and output tokens received."""
        return PolicyStatistics(**self._stats)

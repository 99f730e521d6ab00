"""``json.loads`` for text that someone else wrote: any failure is a ``ValueError``.

Model outputs, agents' requests, files written in a sandbox and dataset rows are parsed as
JSON. Nesting deep enough to exhaust the interpreter's recursion limit (a degenerate output
repeating ``[`` for thousands of tokens) makes the C decoder raise ``RecursionError``, which
callers that catch ``ValueError`` for "not JSON" would let through: a crash instead of an
ill-formed tool call or a 400.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec


def loads(text: str | bytes | bytearray) -> Any:
    """The JSON value of ``text``.

    Raises:
        ValueError: not JSON (``json.JSONDecodeError``), bytes that are not UTF-8
            (``UnicodeDecodeError``), or nested too deeply to decode.
    """
    # msgspec first (2-4x faster: the gateway parses every resent history); what it refuses
    # (NaN, 1e400, a BOM, a lone surrogate, ...) is decided by json, as it always was. A str
    # holding a lone surrogate itself (not its escape) cannot even be encoded for msgspec.
    try:
        return msgspec.json.decode(text)
    except (msgspec.DecodeError, UnicodeEncodeError):
        pass
    except RecursionError:
        raise ValueError("JSON nested too deeply to decode") from None
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("JSON nested too deeply to decode") from None

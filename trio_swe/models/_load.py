"""Loading a Hugging Face tokenizer from a checkpoint directory: offline, once per process.

The path is a filesystem path, never a hub id: anything that is not a directory holding a
tokenizer is refused before ``transformers`` is asked, so no code path can reach the network
(``HF_HUB_OFFLINE`` semantics, enforced here rather than through the process environment).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

from .._errors import ConfigError

__all__ = ["TOKENIZER_FILES", "clear_tokenizer_cache", "load_tokenizer"]

#: Files of which a checkpoint directory must hold at least one to have a tokenizer.
TOKENIZER_FILES: tuple[str, ...] = (
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "vocab.json",
)

_CACHE: dict[str, Any] = {}
_LOCK = threading.Lock()


def _import_auto_tokenizer() -> Any:
    try:
        # transformers warns once that torch is missing; tokenizers need no torch.
        import transformers
    except ImportError as exc:
        raise ConfigError(
            "a checkpoint tokenizer needs the 'hf' extra: pip install 'trio-swe[hf]' "
            f"({type(exc).__name__}: {exc})"
        ) from exc
    return transformers.AutoTokenizer


def load_tokenizer(path: str | os.PathLike[str], *, require_chat_template: bool = True) -> Any:
    """The tokenizer of the checkpoint directory ``path``, loaded once per process and shared.

    ``transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)``; later calls with
    the same (resolved) path return the same object, from any thread. Loading takes about a
    second; call it from a worker thread in async code (``trio.to_thread.run_sync``).

    Raises:
        ConfigError: the path does not exist, is not a directory, holds no tokenizer file, the
            files do not load, the checkpoint has no chat template (when
            ``require_chat_template``), or ``transformers`` is not installed. The message names
            the path.
    """
    raw = os.fspath(path)
    if not raw:
        raise ConfigError("tokenizer path is empty")
    p = Path(raw).expanduser()
    if not p.exists():
        raise ConfigError(f"tokenizer path {raw!r} does not exist")
    if not p.is_dir():
        raise ConfigError(f"tokenizer path {raw!r} is not a directory (a checkpoint folder)")
    if not any((p / name).is_file() for name in TOKENIZER_FILES):
        raise ConfigError(
            f"tokenizer path {raw!r} holds no tokenizer file (one of {', '.join(TOKENIZER_FILES)})"
        )
    key = str(p.resolve())
    with _LOCK:
        tokenizer = _CACHE.get(key)
        if tokenizer is None:
            auto = _import_auto_tokenizer()
            try:
                tokenizer = auto.from_pretrained(key, local_files_only=True)
            except Exception as exc:  # transformers raises OSError, ValueError, KeyError, ...
                raise ConfigError(
                    f"tokenizer at {raw!r} does not load: {type(exc).__name__}: {exc}"
                ) from exc
            _CACHE[key] = tokenizer
    if require_chat_template and not getattr(tokenizer, "chat_template", None):
        raise ConfigError(
            f"tokenizer at {raw!r} has no chat template (no chat_template in "
            "tokenizer_config.json and no chat_template.jinja)"
        )
    return tokenizer


def clear_tokenizer_cache() -> None:
    """Forget the loaded tokenizers (tests; a process that swaps checkpoints)."""
    with _LOCK:
        _CACHE.clear()

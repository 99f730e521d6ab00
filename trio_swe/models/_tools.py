"""The built-in agent's tools, declared to chat templates in the OpenAI function format."""

from __future__ import annotations

from typing import Any, Final

__all__ = ["BASH_TOOL", "EDIT_TOOL"]

BASH_TOOL: Final[dict[str, Any]] = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": (
            "Run a shell command in the repository and see its exit code and output. "
            "Run `submit` (alone) when the fix is done."
        ),
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string", "description": "the shell command"}},
            "required": ["command"],
        },
    },
}

EDIT_TOOL: Final[dict[str, Any]] = {
    "type": "function",
    "function": {
        "name": "edit_file",
        "description": (
            "Replace the one occurrence of old_text in a file with new_text "
            "(an empty old_text writes new_text as the whole file)."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "file path, relative to the repository"},
                "old_text": {"type": "string", "description": "the exact text to replace"},
                "new_text": {"type": "string", "description": "the replacement"},
            },
            "required": ["path", "old_text", "new_text"],
        },
    },
}

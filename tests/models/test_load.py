"""Loading a checkpoint's tokenizer offline, and the start-up errors of a bad one."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from trio_swe import ConfigError
from trio_swe.models import (
    BASH_TOOL,
    ChatModel,
    TemplateError,
    load_tokenizer,
)

from ..qwen3 import SPECIAL_IDS, checkpoint_with_template, qwen3_config


def test_fixture_is_qwen3_with_its_special_ids(qwen3: ChatModel) -> None:
    tok = qwen3.tokenizer
    for text, token_id in SPECIAL_IDS.items():
        assert tok.convert_tokens_to_ids(text) == token_id
        # Written in text, a special is encoded as the special, never as its characters.
        assert qwen3.encode(text) == [token_id]
    assert qwen3.vocab_size == 151669
    assert qwen3.stop_id == 151645
    assert qwen3.parser.name == "hermes"  # inferred from the template


def test_loaded_once_per_process(qwen3_path: Path) -> None:
    assert load_tokenizer(qwen3_path) is load_tokenizer(str(qwen3_path) + "/")


@pytest.mark.parametrize(
    "make",
    [
        lambda tmp: tmp / "missing",
        lambda tmp: (tmp / "file.json").write_text("{}") and tmp / "file.json",
        lambda tmp: tmp,  # a directory without tokenizer files
        lambda tmp: Path("Qwen/Qwen3-8B"),  # a hub id is not a path: refused, nothing fetched
    ],
    ids=["missing", "file", "empty-dir", "hub-id"],
)
def test_bad_paths_are_config_errors_naming_the_path(tmp_path: Path, make: object) -> None:
    path = make(tmp_path)  # type: ignore[operator]
    with pytest.raises(ConfigError, match=str(path).replace("/", ".")):
        load_tokenizer(path)


def test_no_chat_template_is_a_config_error(tmp_path: Path) -> None:
    ckpt = checkpoint_with_template(tmp_path / "ckpt", None)
    with pytest.raises(ConfigError, match="no chat template") as info:
        ChatModel.from_checkpoint(ckpt, tools=[BASH_TOOL])
    assert str(ckpt) in str(info.value)


def test_unloadable_files_are_a_config_error(tmp_path: Path) -> None:
    ckpt = checkpoint_with_template(tmp_path / "ckpt", "{{ messages }}")
    (ckpt / "tokenizer.json").write_text("{not json")
    (ckpt / "vocab.json").unlink()
    with pytest.raises(ConfigError, match="does not load"):
        load_tokenizer(ckpt)


def test_template_that_ignores_tools_fails_before_any_episode(tmp_path: Path) -> None:
    # Qwen3's template with its tools block cut out: renders chats, silently drops the tools.
    template = qwen3_config()["chat_template"]
    no_tools = template.replace("{%- if tools %}", "{%- if false %}", 1)
    ckpt = checkpoint_with_template(tmp_path / "ckpt", no_tools)
    ChatModel.from_checkpoint(ckpt)  # fine without tools
    with pytest.raises(TemplateError, match="cannot render tools") as info:
        ChatModel.from_checkpoint(ckpt, tools=[BASH_TOOL])
    assert str(ckpt) in str(info.value)
    assert isinstance(info.value, ConfigError)


def test_parser_that_does_not_read_the_template_back_fails_at_start(qwen3_path: Path) -> None:
    with pytest.raises(TemplateError, match="does not read back"):
        ChatModel.from_checkpoint(qwen3_path, tools=[BASH_TOOL], tool_parser="qwen3_coder")


def test_unknown_parser_name(qwen3_path: Path) -> None:
    with pytest.raises(ConfigError, match="hermes, qwen3_coder"):
        ChatModel.from_checkpoint(qwen3_path, tools=[BASH_TOOL], tool_parser="nope")


def test_template_that_raises_is_a_template_error(tmp_path: Path) -> None:
    ckpt = checkpoint_with_template(tmp_path / "ckpt", "{{ raise_exception('no tools here') }}")
    with pytest.raises(TemplateError, match="no tools here"):
        ChatModel.from_checkpoint(ckpt)


def test_checkpoint_dir_is_copied_not_shared(tmp_path: Path, qwen3_path: Path) -> None:
    # A copy of the fixture is a different checkpoint: loaded on its own, same ids.
    ckpt = tmp_path / "copy"
    shutil.copytree(qwen3_path, ckpt)
    tok = load_tokenizer(ckpt)
    assert tok is not load_tokenizer(qwen3_path)
    assert tok.encode("hello world") == load_tokenizer(qwen3_path).encode("hello world")
    assert json.loads((ckpt / "tokenizer_config.json").read_text())["eos_token"] == "<|im_end|>"


def test_importing_the_package_does_not_import_transformers() -> None:
    import subprocess
    import sys

    code = "import sys, trio_swe, trio_swe.models; assert 'transformers' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_tool_descriptions_with_newlines_and_quotes_render(qwen3_path: Path) -> None:
    # Claude Code's tool descriptions span lines and quote things: tojson escapes them.
    tool = {
        "type": "function",
        "function": {
            "name": "Read",
            "description": 'Reads a file.\nUsage:\n- "file_path" must be absolute',
            "parameters": {
                "type": "object",
                "properties": {"file_path": {"type": "string"}},
                "required": ["file_path"],
            },
        },
    }
    model = ChatModel.from_checkpoint(qwen3_path, tools=[tool])
    assert "Reads a file" in model.render([{"role": "user", "content": "hi"}])


def test_first_tool_with_several_required_arguments(qwen3_path: Path) -> None:
    # Claude Code's Edit: the probe's tool call must carry every required argument.
    edit = {
        "type": "function",
        "function": {
            "name": "Edit",
            "parameters": {
                "type": "object",
                "properties": {
                    "file_path": {"type": "string"},
                    "old_string": {"type": "string"},
                    "new_string": {"type": "string"},
                },
                "required": ["file_path", "old_string", "new_string"],
            },
        },
    }
    assert (
        ChatModel.from_checkpoint(qwen3_path, tools=[edit]).tools[0]["function"]["name"] == "Edit"
    )


def test_vocabulary_size_counts_added_tokens(qwen3: ChatModel, qwen3_path: Path) -> None:
    from trio_swe.policy import ByteTokenizer, vocabulary_size

    tok = load_tokenizer(qwen3_path)
    assert tok.vocab_size == 151643  # without the added specials: <|im_end|> would be "outside"
    assert vocabulary_size(tok) == vocabulary_size(qwen3) == len(qwen3) == 151669
    assert vocabulary_size(ByteTokenizer()) == 256

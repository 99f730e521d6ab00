"""Tool-call parsers: hermes (Qwen3) and Qwen3-Coder's XML, and ill-formed outputs."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from trio_swe.models import (
    BASH_TOOL,
    EDIT_TOOL,
    MAX_ARGUMENT_DEPTH,
    ChatModel,
    HermesToolParser,
    Qwen3CoderToolParser,
    ToolCall,
    infer_tool_parser,
    split_reasoning,
)
from trio_swe.models._parsers import blocks, parameters

from ..qwen3 import CODER_STYLE_TEMPLATE, checkpoint_with_template, qwen3_config

CALL = '<tool_call>\n{"name": "bash", "arguments": {"command": "ls -la"}}\n</tool_call>'


def test_hermes_one_and_many() -> None:
    p = HermesToolParser()
    assert p.parse(CALL) == ("", [ToolCall("bash", {"command": "ls -la"})], "")
    two = f"Let me look.\n{CALL}\n{CALL.replace('ls -la', 'pwd')}"
    content, calls, error = p.parse(two)
    assert (content, error) == ("Let me look.", "")
    assert [c.arguments["command"] for c in calls] == ["ls -la", "pwd"]
    # Arguments given as a JSON string are read too.
    s = '<tool_call>{"name": "bash", "arguments": "{\\"command\\": \\"x\\"}"}</tool_call>'
    assert p.parse(s)[1] == [ToolCall("bash", {"command": "x"})]


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (
            '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}\n</tool_call>',
            "not valid JSON",
        ),
        ('<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}', "not closed"),
        ('<tool_call>["bash"]</tool_call>', "no string 'name'"),
        ('<tool_call>{"name": "bash", "arguments": [1]}</tool_call>', "not an object"),
    ],
)
def test_hermes_ill_formed(text: str, reason: str) -> None:
    _, calls, error = HermesToolParser().parse(text)
    assert calls == []
    assert reason in error


DEEP = "[" * 100_000  # a degenerate output: nested past the interpreter's recursion limit


def test_deep_nesting_is_ill_formed_not_a_crash() -> None:
    # json.loads raises RecursionError here, which "except ValueError" let through.
    for text, reason in (
        (f"<tool_call>{DEEP}</tool_call>", "nested too deeply"),
        # Arguments as a JSON string that does not decode stay a string: not an object.
        ('<tool_call>{"name": "bash", "arguments": "' + DEEP + '"}</tool_call>', "not an object"),
    ):
        _, calls, error = HermesToolParser().parse(text)
        assert calls == []
        assert reason in error
    tools = [{"function": {"name": "f", "parameters": {"properties": {"a": {"type": "array"}}}}}]
    text = (
        f"<tool_call>\n<function=f>\n<parameter=a>\n{DEEP}\n</parameter>\n</function>\n</tool_call>"
    )
    _, calls, error = Qwen3CoderToolParser(tools).parse(text)
    assert calls == []
    assert "parameter 'a'" in error
    assert "nested too deeply" in error


def test_coder_xml_with_schema_types() -> None:
    tools = [
        {
            "type": "function",
            "function": {
                "name": "view",
                "description": "d",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "path": {"type": "string"},
                        "line": {"type": "integer"},
                        "all": {"type": "boolean"},
                    },
                },
            },
        }
    ]
    text = (
        "I will look.\n<tool_call>\n<function=view>\n<parameter=path>\na b.py\n</parameter>\n"
        "<parameter=line>\n12\n</parameter>\n<parameter=all>\ntrue\n</parameter>\n</function>\n"
        "</tool_call>"
    )
    p = Qwen3CoderToolParser(tools)
    assert p.parse(text) == (
        "I will look.",
        [ToolCall("view", {"path": "a b.py", "line": 12, "all": True})],
        "",
    )
    # A multi-line value keeps its inner newlines; only the framing ones go.
    body = "<tool_call>\n<function=bash>\n<parameter=command>\nprintf 'a\\n'\necho b\n</parameter>\n</function>\n</tool_call>"
    assert p.parse(body)[1] == [ToolCall("bash", {"command": "printf 'a\\n'\necho b"})]
    bad_int = text.replace("\n12\n", "\ntwelve\n")
    assert "parameter 'line'" in p.parse(bad_int)[2]
    assert "outside <tool_call>" in p.parse("<function=view>\n</function>")[2]
    assert "not one <function" in p.parse("<tool_call>\nview\n</tool_call>")[2]


def test_reasoning_split() -> None:
    assert split_reasoning("<think>\nhmm\n</think>\n\nhi") == ("hmm", "hi")
    assert split_reasoning("only the close\n</think>\n\nhi") == ("only the close", "hi")
    assert split_reasoning("no reasoning") == (None, "no reasoning")


def test_inferred_from_templates() -> None:
    assert infer_tool_parser(qwen3_config()["chat_template"]) == "hermes"
    assert infer_tool_parser(CODER_STYLE_TEMPLATE) == "qwen3_coder"


def test_coder_style_checkpoint_round_trip(tmp_path: Path) -> None:
    ckpt = checkpoint_with_template(tmp_path / "coder", CODER_STYLE_TEMPLATE)
    model = ChatModel.from_checkpoint(ckpt, tools=[BASH_TOOL, EDIT_TOOL])
    assert model.parser.name == "qwen3_coder"
    call = ToolCall("edit_file", {"path": "a.py", "old_text": "x = 1\n", "new_text": "x = 2\n"})
    from trio_swe.models import ParsedOutput

    sampled = model.assistant_text(ParsedOutput(text="", tool_calls=(call,)).message())
    assert "<function=edit_file>" in sampled
    assert sampled.endswith("<|im_end|>")
    assert model.parse(model.encode(sampled)).tool_calls == (call,)


def test_arguments_nested_past_the_cap_are_ill_formed(qwen3: ChatModel) -> None:
    def call(depth: int) -> str:
        deep = "[" * depth + "]" * depth
        return (
            '<tool_call>\n{"name": "bash", "arguments": {"command": "ls", "x": '
            + deep
            + "}}\n</tool_call><|im_end|>"
        )

    # 600 levels parse as JSON, and Qwen3's template then failed to render the next prompt
    # (TemplateError): the episode ended on one degenerate output.
    out = qwen3.parse(call(600))
    assert out.ill_formed
    assert out.tool_calls == ()
    assert f"nested deeper than {MAX_ARGUMENT_DEPTH} levels" in out.error
    # At the cap (the arguments object is level 1), the call stands and renders back.
    ok = qwen3.parse(call(MAX_ARGUMENT_DEPTH - 1))
    assert not ok.ill_formed, ok.error
    assert qwen3.parse(qwen3.encode(qwen3.assistant_text(ok.message()))).tool_calls == ok.tool_calls
    assert qwen3.parse(call(MAX_ARGUMENT_DEPTH)).ill_formed


def test_model_level_ill_formed(qwen3: ChatModel) -> None:
    unknown = CALL.replace('"bash"', '"python"')
    out = qwen3.parse(qwen3.encode(f"<think>\nx\n</think>\n\n{unknown}<|im_end|>"))
    assert out.ill_formed
    assert "unknown tool 'python'" in out.error
    assert out.tool_calls == ()
    assert out.reasoning == "x"
    missing = '<tool_call>\n{"name": "bash", "arguments": {}}\n</tool_call>'
    assert "needs the argument 'command'" in qwen3.parse(missing).error
    wrong = '<tool_call>\n{"name": "bash", "arguments": {"command": 3}}\n</tool_call>'
    assert "must be a string" in qwen3.parse(wrong).error
    prose = qwen3.parse("I think the bug is in add().")
    assert prose.ill_formed
    assert "no tool call" in prose.error
    assert prose.content.startswith("I think")
    ok = qwen3.parse(CALL + "<|im_end|>")
    assert not ok.ill_formed
    assert ok.tool_calls == (ToolCall("bash", {"command": "ls -la"}),)


# -- degenerate outputs: the blocks are found in linear time, as the regexes found them --------
_REGEX_BLOCKS = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_REGEX_PARAMS = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.DOTALL)
_FRAGMENTS = st.lists(
    st.sampled_from(
        ["<tool_call>", "</tool_call>", "<parameter=", "</parameter>", ">", "\n", "a", "b c", "<"]
    ),
    max_size=40,
).map("".join)


@given(_FRAGMENTS)
@example("<parameter=\n<parameter=a>x</parameter>")
@example("<parameter=><parameter=b>y</parameter>")
@example("<parameter=<parameter=c>z</parameter>")
def test_linear_scanners_find_what_the_regexes_found(text: str) -> None:
    assert blocks(text, "<tool_call>", "</tool_call>") == (
        _REGEX_BLOCKS.findall(text),
        _REGEX_BLOCKS.sub("", text),
    )
    assert parameters(text) == (_REGEX_PARAMS.findall(text), _REGEX_PARAMS.sub("", text))


def test_a_degenerate_output_is_parsed_in_linear_time() -> None:
    # 50,000 unclosed tags: the regexes rescanned the rest of the text from each (16,000
    # <parameter= took 100 s here, on the event loop); the scanners take milliseconds. A
    # subprocess, so that the old behaviour fails on the timeout instead of hanging the run.
    code = (
        "from trio_swe.models import HermesToolParser, Qwen3CoderToolParser\n"
        "n = 50_000\n"
        "coder = '<tool_call>\\n<function=f>\\n' + '<parameter=a>' * n + '\\n</function>\\n</tool_call>'\n"
        "assert 'outside <parameter' in Qwen3CoderToolParser().parse(coder)[2]\n"
        "flipped = '</tool_call>' * n + '<tool_call>' * n\n"
        "for p in (HermesToolParser(), Qwen3CoderToolParser()):\n"
        "    assert p.parse(flipped)[1] == []\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)

"""Real models: a checkpoint's tokenizer, its own chat template, tool-call parsers, and
append-only token histories. Needs the ``hf`` extra (``pip install 'trio-swe[hf]'``:
``transformers`` without torch); this package imports it only when a tokenizer is loaded.

Load (offline, once per process; a bad path or a checkpoint without a chat template is a
:class:`~trio_swe.ConfigError` naming the path, a template that cannot render the tools a
:class:`TemplateError`)::

    from trio_swe.models import BASH_TOOL, ChatModel

    model = ChatModel.from_checkpoint("/ckpt/Qwen3-8B", tools=[BASH_TOOL])  # parser inferred
    model.render(messages, add_generation_prompt=True)   # tokenizer.apply_chat_template(tools=)
    model.assistant_text(message)      # what the model samples for an assistant message
    model.parse(output_ids)            # ParsedOutput: reasoning, content, tool_calls, ill_formed

Token in, token out, append-only::

    history = model.start([{"role": "system", ...}, {"role": "user", ...}])
    out = await policy.generate(history.ids, params)          # history.ids: array('i')
    parsed = history.append_output(out.output_ids)            # the exact sampled ids
    history.append_messages([{"role": "tool", "content": "..."}])   # only this is tokenized

``append_messages`` renders the delta with the template (the ``\\n`` after ``<|im_end|>``, the
tool turn's header, the next generation prompt), so the history equals the template's rendering
of the whole conversation wherever the template is append-only. Where it is not: a ``user``
message after reasoning turns (Qwen3 drops their reasoning) raises
:class:`NotAppendOnlyError` and :meth:`TokenHistory.fork` starts a new history; a tool-only delta
after a turn the template would re-render (Qwen3's empty ``<think>`` block) keeps the sampled
tokens and counts ``rewritten_turns``.

Parsers (:func:`get_tool_parser`, ``SWE_TOOL_PARSER``, :func:`register_tool_parser`):
``hermes`` (``<tool_call>{json}</tool_call>``) and ``qwen3_coder`` (``<function=...>`` XML);
``"auto"`` infers one from the template (:func:`infer_tool_parser`).
"""

from .._errors import NotAppendOnlyError, TemplateError, TokenLimitError
from ._chat import ChatModel, HistoryStatistics, TokenHistory
from ._load import TOKENIZER_FILES, clear_tokenizer_cache, load_tokenizer
from ._parsers import (
    MAX_ARGUMENT_DEPTH,
    HermesToolParser,
    ParsedOutput,
    Qwen3CoderToolParser,
    ToolCall,
    ToolParser,
    available_tool_parsers,
    get_tool_parser,
    infer_tool_parser,
    register_tool_parser,
    split_reasoning,
    validate_tool_calls,
)
from ._tools import BASH_TOOL, EDIT_TOOL

__all__ = [
    "BASH_TOOL",
    "EDIT_TOOL",
    "MAX_ARGUMENT_DEPTH",
    "TOKENIZER_FILES",
    "ChatModel",
    "HermesToolParser",
    "HistoryStatistics",
    "NotAppendOnlyError",
    "ParsedOutput",
    "Qwen3CoderToolParser",
    "TemplateError",
    "TokenHistory",
    "TokenLimitError",
    "ToolCall",
    "ToolParser",
    "available_tool_parsers",
    "clear_tokenizer_cache",
    "get_tool_parser",
    "infer_tool_parser",
    "load_tokenizer",
    "register_tool_parser",
    "split_reasoning",
    "validate_tool_calls",
]

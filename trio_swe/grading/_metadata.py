"""Reading dataset rows into :class:`InstanceMetadata` (sans-IO).

Row shapes accepted:

* slime-style samples: ``{"prompt", "label", "metadata": {..., "remote_env_info": {...}}}``;
* flat SWE-bench rows (classic and the 5.x shape with ``eval_script``/``log_parser``);
* flat SWE-bench Pro rows (``before_repo_set_cmd``, ``selected_test_files_to_run``, ...);
* flat Scale-SWE rows (``image_url``, ``workdir``, ``pre_commands``, ``f2p_script``).

Every malformed value raises :class:`MetadataError` naming the field; nothing else escapes.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping, Sequence
from typing import Any, Final

from .._errors import MetadataError
from .._json import loads
from ._types import (
    DEFAULT_WORKDIR,
    InstanceMetadata,
    ScaleSweGrading,
    SweBenchGrading,
    SweProSpec,
)

#: A label longer than this is a reference answer, not an instance id (slime's rule).
MAX_LABEL_ID_CHARS: Final = 256
#: Upper bound on an instance id (ids end up in file names and logs).
MAX_INSTANCE_ID_CHARS: Final = 512
#: SWE-bench Pro images (the official harness's convention).
SWEPRO_IMAGE_PREFIX: Final = "jefzda/sweap-images:"
SWEPRO_WORKDIR: Final = "/app"
EVAL_TYPES: Final = ("pass_and_fail", "fail_only")
LOOKS_SWEBENCH: Final = "protocol_row_mismatch:looks_swebench"
LOOKS_SCALESWE: Final = "protocol_row_mismatch:looks_scaleswe"


class _Sources:
    """Ordered lookup of a key across the row's layers, remembering where a value came from."""

    def __init__(self, layers: Sequence[tuple[str, Mapping[str, Any]]]) -> None:
        self.layers = layers

    def find(self, *keys: str) -> tuple[Any, str]:
        """The first present, non-empty value of any of ``keys`` and its dotted field name."""
        for prefix, layer in self.layers:
            for key in keys:
                if key in layer:
                    value = layer[key]
                    if value is not None and value != "":
                        return value, prefix + key
        prefix = self.layers[0][0] if self.layers else ""
        return None, prefix + keys[0]

    def has_any(self, *keys: str) -> bool:
        return any(self.find(k)[0] is not None for k in keys)


def _mapping(value: Any, field: str) -> Mapping[str, Any]:
    """A mapping, or a JSON object string (some exports stringify nested dicts)."""
    if isinstance(value, Mapping):
        return value
    if isinstance(value, str):
        try:
            decoded = loads(value)
        except ValueError:
            decoded = None
        if isinstance(decoded, Mapping):
            return decoded
    raise MetadataError(field, f"expected a mapping, got {type(value).__name__}")


def _layers(row: Mapping[str, Any], *, rem_first: bool) -> tuple[_Sources, bool]:
    """The lookup layers of a row and whether it is slime-style (has ``metadata``)."""
    if not isinstance(row, Mapping):
        raise MetadataError("row", f"expected a mapping, got {type(row).__name__}")
    raw_md = row.get("metadata")
    if raw_md is None:
        layers: list[tuple[str, Mapping[str, Any]]] = [("", row)]
        if row.get("remote_env_info") is not None:
            layers.append(("remote_env_info.", _mapping(row["remote_env_info"], "remote_env_info")))
        return _Sources(layers), False
    m = _mapping(raw_md, "metadata")
    raw_rem = m.get("remote_env_info")
    rem = {} if raw_rem is None else _mapping(raw_rem, "metadata.remote_env_info")
    pair = [("metadata.", m), ("metadata.remote_env_info.", rem)]
    return _Sources(pair[::-1] if rem_first else pair), True


def _encodable(text: str, field: str) -> str:
    """``text``, refused if it holds a lone surrogate (a JSON ``"\\ud800"`` escape decodes to
    one): it could not be written to a sandbox, a log or a results file."""
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise MetadataError(
                field,
                f"contains a lone surrogate U+{ord(text[exc.start]):04X} at index {exc.start} "
                "(not encodable text)",
            ) from None
    return text


def _deep_encodable(value: Any, field: str) -> None:
    """Every string inside a nested mapping/list value is encodable (see :func:`_encodable`)."""
    if isinstance(value, str):
        _encodable(value, field)
    elif isinstance(value, Mapping):
        for k, v in value.items():
            _encodable(str(k), field)
            _deep_encodable(v, f"{field}.{k}")
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            _deep_encodable(v, f"{field}[{i}]")


def _str(value: Any, field: str) -> str:
    if not isinstance(value, str):
        raise MetadataError(field, f"expected a string, got {type(value).__name__}")
    if "\x00" in value:
        raise MetadataError(field, "contains a NUL character")
    return _encodable(value, field)


def _opt_str(src: _Sources, *keys: str) -> str | None:
    value, field = src.find(*keys)
    return None if value is None else _str(value, field)


def _req_str(src: _Sources, *keys: str, why: str) -> str:
    value, field = src.find(*keys)
    if value is None:
        raise MetadataError(field, f"missing ({why})")
    text = _str(value, field)
    if not text.strip():
        raise MetadataError(field, f"empty ({why})")
    return text


def _str_list(value: Any, field: str) -> tuple[str, ...]:
    """A list of strings given as a list, a JSON string, or a Python-literal string (SWE-bench Pro)."""
    if value is None or value == "":
        return ()
    if isinstance(value, str):
        decoded: Any
        try:
            decoded = loads(value)
        except ValueError:
            try:
                decoded = ast.literal_eval(value)
            except (ValueError, SyntaxError, MemoryError, RecursionError, TypeError):
                raise MetadataError(
                    field, "expected a list of strings (or its JSON text), got unparsable text"
                ) from None
        value = decoded
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise MetadataError(field, f"expected a list of strings, got {type(value).__name__}")
    out: list[str] = []
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise MetadataError(f"{field}[{i}]", f"expected a string, got {type(item).__name__}")
        out.append(_encodable(item, f"{field}[{i}]"))
    return tuple(out)


def _unquote(text: str) -> str:
    """SWE-bench Pro stores some texts JSON-encoded inside a string: ``"\\"...\\n...\\""``."""
    if len(text) >= 2 and text[0] == '"' and text[-1] == '"':
        try:
            decoded = loads(text)
        except ValueError:
            return text
        if isinstance(decoded, str):
            return decoded
    return text


def _coerce_prompt(prompt: Any) -> str:
    """A prompt as text: a string, or the first user message of a chat (content flattened)."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, Sequence):
        for msg in prompt:
            if isinstance(msg, Mapping) and msg.get("role", "user") == "user":
                content = msg.get("content")
                if isinstance(content, str):
                    return content
                if isinstance(content, Sequence):
                    parts = [
                        b.get("text")
                        for b in content
                        if isinstance(b, Mapping) and isinstance(b.get("text"), str)
                    ]
                    return "\n".join(p for p in parts if p)
    return ""


def _instance_id(src: _Sources, row: Mapping[str, Any]) -> str:
    value, field = src.find("instance_id")
    if value is not None:
        iid = _str(value, field)
    else:
        label = row.get("label")
        iid = label if isinstance(label, str) and 0 < len(label) < MAX_LABEL_ID_CHARS else "unknown"
        field = "label"
        _encodable(iid, field)
    if len(iid) > MAX_INSTANCE_ID_CHARS:
        raise MetadataError(field, f"longer than {MAX_INSTANCE_ID_CHARS} characters")
    if any(c in iid for c in "\n\r"):
        raise MetadataError(field, "contains a newline")
    return iid.strip() or "unknown"


def instance_id_of(row: Mapping[str, Any]) -> str:
    """The row's instance id as :func:`get_metadata` reads it, whatever the row's shape
    (a flat ``instance_id``, slime's ``metadata.instance_id`` or ``label``); ``"unknown"``
    when it has none.

    Raises:
        MetadataError: the id is malformed (not text, too long, a newline).
    """
    src, _ = _layers(row, rem_first=False)
    return _instance_id(src, row)


def _problem_statement(src: _Sources, row: Mapping[str, Any]) -> str:
    value, field = src.find("problem_statement")
    if value is not None:
        return _encodable(_unquote(_str(value, field)), field)
    return _encodable(_coerce_prompt(row.get("prompt")), "prompt")


def _workdir(src: _Sources, default: str) -> str:
    value, field = src.find("workdir")
    if value is None:
        return default
    wd = _str(value, field)
    if not wd.startswith("/") or any(c in wd for c in "\n\r") or ".." in wd.split("/"):
        raise MetadataError(
            field, f"expected an absolute path without newlines or '..', got {wd!r}"
        )
    wd = wd.rstrip("/")
    if not wd:
        raise MetadataError(field, "the repository cannot live at /")
    return wd


def _image(value: Any, field: str) -> str:
    img = _str(value, field).strip()
    if not img or any(c in img for c in "\n\r"):
        raise MetadataError(field, "expected a non-empty single-line image name")
    return img


def _pre_commands(value: Any, field: str) -> tuple[str, ...]:
    """``pre_commands``: a string (literal ``\\n`` means a newline, as in Scale-SWE) or a list."""
    if value is None:
        return ()
    if isinstance(value, str):
        lines = value.replace("\\n", "\n").split("\n")
    elif isinstance(value, Sequence):
        lines = [_str(item, f"{field}[{i}]") for i, item in enumerate(value)]
    else:
        raise MetadataError(field, f"expected a string or a list, got {type(value).__name__}")
    out = tuple(ln for ln in lines if ln.strip())
    for ln in out:
        _str(ln, field)
    return out


def _swepro(value: Any, field: str) -> SweProSpec:
    d = _mapping(value, field or "row")
    prefix = field + "." if field else ""
    src = _Sources([(prefix, d)])
    cmd, cmd_field = src.find("before_repo_set_cmd")
    if cmd is not None:
        cmd = _pre_commands(cmd, cmd_field)
    spec = SweProSpec(
        before_repo_set_cmd="\n".join(cmd or ()),
        selected_test_files=_str_list(
            *src.find("selected_test_files", "selected_test_files_to_run")
        ),
        fail_to_pass=_str_list(*src.find("fail_to_pass", "FAIL_TO_PASS")),
        pass_to_pass=_str_list(*src.find("pass_to_pass", "PASS_TO_PASS")),
        run_script_path=_opt_str(src, "run_script_path"),
        parser_script_path=_opt_str(src, "parser_script_path"),
        run_script=_opt_str(src, "run_script"),
        parser_script=_opt_str(src, "parser_script"),
    )
    if spec.run_script is None and spec.run_script_path is None:
        raise MetadataError(prefix + "run_script_path", "missing (or give run_script inline)")
    if spec.parser_script is None and spec.parser_script_path is None:
        raise MetadataError(prefix + "parser_script_path", "missing (or give parser_script inline)")
    return spec


def _looks_swepro_flat(src: _Sources) -> bool:
    return src.has_any("before_repo_set_cmd") and src.has_any(
        "selected_test_files_to_run", "fail_to_pass"
    )


def scaleswe_metadata(row: Mapping[str, Any], protocol: str = "scaleswe") -> InstanceMetadata:
    """Read a row for the ``scaleswe`` protocol (slime's ``_metadata_scaleswe`` and flat rows)."""
    src, _ = _layers(row, rem_first=False)
    swepro: SweProSpec | None = None
    value, field = src.find("swepro")
    if value is not None:
        swepro = _swepro(value, field)
    elif _looks_swepro_flat(src):
        prefix, layer = src.layers[0]
        swepro = _swepro(layer, prefix.rstrip("."))
    grading = ScaleSweGrading(
        swepro=swepro,
        eval_cmd=_opt_str(src, "eval_cmd"),
        f2p_script=_opt_str(src, "f2p_script"),
        pre_commands=_pre_commands(*src.find("pre_commands")),
        pass_to_pass=_str_list(*src.find("PASS_TO_PASS")) if swepro is None else (),
        fail_to_pass=_str_list(*src.find("FAIL_TO_PASS")) if swepro is None else (),
        log_parser=_opt_str(src, "log_parser"),
    )
    looks_swebench = grading.grader is None and src.has_any("test_patch", "eval_script")
    img, img_field = src.find("image", "image_url", "docker_image")
    if img is None and looks_swebench:
        # Flagged below; the image SWE-bench would use keeps the metadata printable.
        img = _default_swebench_image(_instance_id(src, row))
    if img is None and swepro is not None:
        tag, tag_field = src.find("dockerhub_tag")
        if tag is not None:
            img, img_field = SWEPRO_IMAGE_PREFIX + _str(tag, tag_field), tag_field
    if img is None:
        raise MetadataError(img_field, "missing (no image or image_url to boot the instance from)")
    return InstanceMetadata(
        protocol=protocol,
        instance_id=_instance_id(src, row),
        image=_image(img, img_field),
        workdir=_workdir(src, SWEPRO_WORKDIR if swepro is not None else DEFAULT_WORKDIR),
        problem_statement=_problem_statement(src, row),
        grading=grading,
        mismatch=LOOKS_SWEBENCH if looks_swebench else None,
    )


def _default_swebench_image(instance_id: str) -> str:
    """SWE-bench's published instance image name (``__`` becomes ``_1776_``)."""
    return f"swebench/sweb.eval.x86_64.{instance_id.replace('__', '_1776_').lower()}:latest"


def swebench_metadata(row: Mapping[str, Any], protocol: str = "swebench") -> InstanceMetadata:
    """Read a row for the ``swebench`` protocol (classic and 5.x SWE-bench rows, slime-style)."""
    src, _ = _layers(row, rem_first=True)
    instance_id = _instance_id(src, row)
    eval_script = _opt_str(src, "eval_script")
    classic_complete = all(src.has_any(k) for k in ("repo", "version", "base_commit", "test_patch"))
    looks_scaleswe = src.has_any("f2p_script", "eval_cmd", "swepro", "before_repo_set_cmd")
    if eval_script is None and not classic_complete and looks_scaleswe:
        # A scaleswe row handed to the swebench protocol: flagged, not an error.
        img, img_field = src.find("image", "image_url", "docker_image")
        return InstanceMetadata(
            protocol=protocol,
            instance_id=instance_id,
            image=_image(img, img_field) if img is not None else "",
            workdir=_workdir(src, DEFAULT_WORKDIR),
            problem_statement=_problem_statement(src, row),
            grading=SweBenchGrading(),
            mismatch=LOOKS_SCALESWE,
        )
    log_parser: str | None = None
    eval_type: str | None = None
    image_assets: Mapping[str, Any] | None = None
    if eval_script is not None:
        if not eval_script.strip():
            raise MetadataError(src.find("eval_script")[1], "empty")
        repo = _req_str(src, "repo", why="swebench's TestSpec needs it")
        version = _opt_str(src, "version") or ""
        base_commit = _opt_str(src, "base_commit") or ""
        test_patch = _opt_str(src, "test_patch") or ""
        log_parser = _req_str(src, "log_parser", why="names the swebench parser of the log")
        eval_type = _opt_str(src, "eval_type") or "pass_and_fail"
        if eval_type not in EVAL_TYPES:
            raise MetadataError(
                src.find("eval_type")[1], f"expected one of {EVAL_TYPES}, got {eval_type!r}"
            )
        assets, assets_field = src.find("image_assets")
        if assets is not None:
            image_assets = _mapping(assets, assets_field)
            _deep_encodable(image_assets, assets_field)
    else:
        repo = _req_str(src, "repo", why="selects swebench's specs and parser")
        version = _req_str(src, "version", why="selects swebench's specs")
        base_commit = _req_str(src, "base_commit", why="the eval script resets tests to it")
        test_patch = _req_str(src, "test_patch", why="the graded tests")
    env_commit = _opt_str(src, "environment_setup_commit")
    grading = SweBenchGrading(
        repo=repo,
        version=version,
        base_commit=base_commit,
        test_patch=test_patch,
        fail_to_pass=_str_list(*src.find("FAIL_TO_PASS", "fail_to_pass")),
        pass_to_pass=_str_list(*src.find("PASS_TO_PASS", "pass_to_pass")),
        environment_setup_commit=env_commit,
        hints_text=_opt_str(src, "hints_text") or "",
        eval_script=eval_script,
        log_parser=log_parser,
        eval_type=eval_type,
        image_assets=image_assets,
    )
    img, img_field = src.find("image", "image_name", "docker_image")
    image = _image(img, img_field) if img is not None else _default_swebench_image(instance_id)
    return InstanceMetadata(
        protocol=protocol,
        instance_id=instance_id,
        image=image,
        workdir=_workdir(src, DEFAULT_WORKDIR),
        problem_statement=_problem_statement(src, row),
        grading=grading,
    )

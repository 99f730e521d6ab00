"""Reading rows of every shape: the real rows in shared/data/rows, slime samples, bad rows."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trio_swe import ConfigError, MetadataError
from trio_swe.grading import (
    InstanceMetadata,
    ScaleSweGrading,
    SweBenchGrading,
    evaluability_check,
    get_metadata,
)

ROWS = Path(__file__).parent / "rows"  # real dataset rows, see rows/README.md


def _row(prefix: str) -> dict[str, Any]:
    (path,) = ROWS.glob(f"{prefix}*.json")
    row: dict[str, Any] = json.loads(path.read_text())
    return row


# -- real rows --------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["pvlib__pvlib-python-1072", "pallets__flask-4992"])
def test_swebench_classic_rows(name: str) -> None:
    row = _row(f"swebench_classic__{name}")
    md = get_metadata(row, "swebench")
    g = md.grading
    assert isinstance(g, SweBenchGrading)
    assert md.instance_id == name
    assert md.workdir == "/testbed"
    # No image in classic rows: SWE-bench's published one (``__`` -> ``_1776_``).
    assert md.image == f"swebench/sweb.eval.x86_64.{name.replace('__', '_1776_')}:latest"
    assert g.fail_to_pass == tuple(json.loads(row["FAIL_TO_PASS"]))
    assert g.pass_to_pass == tuple(json.loads(row["PASS_TO_PASS"]))
    assert (g.repo, g.version, g.base_commit) == (row["repo"], row["version"], row["base_commit"])
    assert g.test_patch == row["test_patch"]
    assert not g.is_v5_row
    assert md.problem_statement == row["problem_statement"]  # \r\n kept
    assert md.mismatch is None


def test_swebench_classic_row_test_ids_keep_brackets_and_slashes() -> None:
    md = get_metadata(_row("swebench_classic__pvlib"), "swebench")
    assert isinstance(md.grading, SweBenchGrading)
    assert md.grading.fail_to_pass == (
        "pvlib/tests/test_temperature.py::test_fuentes_timezone[Etc/GMT+5]",
    )


@pytest.mark.parametrize("name", ["markedjs__marked-684", "chartjs__Chart.js-11352"])
def test_swebench_v5_rows(name: str) -> None:
    row = _row(f"swebench_v5__{name}")
    md = get_metadata(row, "swebench")
    g = md.grading
    assert isinstance(g, SweBenchGrading)
    assert g.is_v5_row
    assert g.eval_script == row["eval_script"]
    assert (g.log_parser, g.eval_type) == (row["log_parser"], "fail_only")
    assert md.image == row["image"]
    assert g.fail_to_pass == tuple(row["FAIL_TO_PASS"])  # a trailing space survives
    assert g.image_assets == row["image_assets"]
    inst = g.instance(md.instance_id, md.image)
    assert inst["eval_script"] == row["eval_script"]
    assert inst["log_parser"] == row["log_parser"]


def test_scaleswe_row() -> None:
    row = _row("scaleswe_partial__")
    md = get_metadata(row, "scaleswe")
    g = md.grading
    assert isinstance(g, ScaleSweGrading)
    assert (md.instance_id, md.image, md.workdir) == (
        row["instance_id"],
        row["image_url"],
        "/workspace/auth0-python",
    )
    assert g.grader == "f2p_script"
    assert g.f2p_script == row["f2p_script"]
    # One &&-joined line ending in a literal backslash-n: one command, the "\n" dropped.
    assert len(g.pre_commands) == 1
    assert g.pre_commands[0].startswith("git clean -fd")
    assert "\\n" not in g.pre_commands[0]
    assert evaluability_check(md) is None


def test_swebench_pro_row_needs_its_run_scripts(tmp_path: Path) -> None:
    row = _row("swebench_pro__")
    with pytest.raises(MetadataError) as err:
        get_metadata(row, "scaleswe")
    assert err.value.field == "run_script_path"
    # The HF rows do not carry Scale's per-instance scripts: the user points at them.
    run, parser = tmp_path / "run_script.sh", tmp_path / "parser.py"
    run.write_text("#!/bin/bash\n")
    parser.write_text("")
    md = get_metadata(
        {**row, "run_script_path": str(run), "parser_script_path": str(parser)}, "scaleswe"
    )
    g = md.grading
    assert isinstance(g, ScaleSweGrading)
    assert g.swepro is not None
    sp = g.swepro
    # Python-literal list with mixed quoting (not JSON).
    assert sp.fail_to_pass[0].endswith("should return multiple keys and null if key doesn't exist")
    assert len(sp.fail_to_pass) == len(eval(row["fail_to_pass"]))
    assert sp.selected_test_files == (
        "test/database.js",
        "test/database/keys.js",
        "test/user/emails.js",
    )
    assert sp.before_repo_set_cmd.splitlines()[-1].startswith("git checkout 04998908")
    # The image and workdir of the official harness; the double-quoted JSON text unwrapped.
    assert md.image == "jefzda/sweap-images:" + row["dockerhub_tag"]
    assert md.workdir == "/app"
    assert md.problem_statement.startswith("**Title: Email Validation")
    assert evaluability_check(md) is None
    # A run script path that does not exist is caught before any episode.
    md2 = get_metadata(
        {**row, "run_script_path": str(tmp_path / "gone.sh"), "parser_script_path": str(parser)},
        "scaleswe",
    )
    assert (evaluability_check(md2) or "").startswith("swepro_run_script_missing")


@pytest.mark.parametrize(
    "prefix", ["swebench_classic__pallets", "swebench_v5__markedjs", "swebench_v5__chartjs"]
)
def test_swebench_rows_are_flagged_under_scaleswe(prefix: str) -> None:
    md = get_metadata(_row(prefix), "scaleswe")
    assert md.mismatch == "protocol_row_mismatch:looks_swebench"
    assert evaluability_check(md) == "protocol_row_mismatch:looks_swebench"


@pytest.mark.parametrize("prefix", ["scaleswe_partial__", "swebench_pro__"])
def test_scaleswe_rows_are_flagged_under_swebench(prefix: str) -> None:
    md = get_metadata(_row(prefix), "swebench")
    assert evaluability_check(md) == "protocol_row_mismatch:looks_scaleswe"


def test_swesmith_row_is_a_typed_error() -> None:
    with pytest.raises(MetadataError) as err:
        get_metadata(_row("swesmith__"), "swebench")
    assert err.value.field == "version"
    with pytest.raises(MetadataError) as err:
        get_metadata(_row("swesmith__"), "scaleswe")
    assert err.value.field == "image"


# -- slime-style samples ----------------------------------------------------------------------
def test_slime_scaleswe_sample_fallbacks() -> None:
    sample = {
        "prompt": [
            {"role": "system", "content": "sys"},
            {
                "role": "user",
                "content": [{"type": "text", "text": "fix"}, {"type": "text", "text": "it"}],
            },
        ],
        "label": "inst-7",
        "metadata": {
            "eval_cmd": "pytest -q",
            "remote_env_info": {
                "image_url": "img:1",
                "workdir": "/workspace/r/",
                "pre_commands": "a\\nb\\n",
                "f2p_script": "x",
            },
        },
    }
    md = get_metadata(sample, "scaleswe")
    g = md.grading
    assert isinstance(g, ScaleSweGrading)
    assert (md.instance_id, md.image, md.workdir) == ("inst-7", "img:1", "/workspace/r")
    assert md.problem_statement == "fix\nit"
    assert g.pre_commands == ("a", "b")
    assert g.grader == "eval_cmd"  # eval_cmd outranks f2p_script


def test_huge_label_is_not_an_instance_id() -> None:
    md = get_metadata({"label": "x" * 10_000, "metadata": {"image": "i", "eval_cmd": "true"}})
    assert md.instance_id == "unknown"


def test_metadata_fields_win_over_remote_env_info_for_scaleswe() -> None:
    md = get_metadata(
        {
            "metadata": {
                "image": "a",
                "instance_id": "m",
                "remote_env_info": {"image_url": "b", "instance_id": "r", "f2p_script": "s"},
            }
        },
        "scaleswe",
    )
    assert (md.image, md.instance_id) == ("a", "m")


def test_slime_swebench_sample_reads_remote_env_info() -> None:
    rem = {
        "instance_id": "o__r-1",
        "repo": "o/r",
        "version": "1.0",
        "base_commit": "abc",
        "test_patch": "diff",
        "FAIL_TO_PASS": '["t1"]',
        "PASS_TO_PASS": [],
        "image": "img",
    }
    md = get_metadata({"prompt": "p", "metadata": {"remote_env_info": rem}}, "swebench")
    assert isinstance(md.grading, SweBenchGrading)
    assert (md.instance_id, md.image, md.problem_statement) == ("o__r-1", "img", "p")
    assert md.grading.fail_to_pass == ("t1",)


def test_sample_objects_are_accepted() -> None:
    class Sample:
        prompt = "p"
        label = "lab"
        metadata = {"image": "i", "f2p_script": "s"}

    md = get_metadata(Sample(), "scaleswe")
    assert (md.instance_id, md.problem_statement) == ("lab", "p")


def test_metadata_is_a_msgspec_record() -> None:
    md = get_metadata(
        {
            "metadata": {
                "image": "i",
                "swepro": {"run_script": "r", "parser_script": "p", "fail_to_pass": ["a"]},
            }
        }
    )
    again = msgspec.json.decode(msgspec.json.encode(md), type=InstanceMetadata)
    assert again == md


# -- typed errors -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("row", "protocol", "field"),
    [
        ({"metadata": {"image": 3, "eval_cmd": "x"}}, "scaleswe", "metadata.image"),
        ({"metadata": {"eval_cmd": "x"}}, "scaleswe", "metadata.image"),
        ({"metadata": "nope"}, "scaleswe", "metadata"),
        (
            {"metadata": {"image": "i", "remote_env_info": 5}},
            "scaleswe",
            "metadata.remote_env_info",
        ),
        (
            {"metadata": {"image": "i", "pre_commands": 5, "eval_cmd": "x"}},
            "scaleswe",
            "metadata.pre_commands",
        ),
        (
            {"metadata": {"image": "i", "workdir": "rel/dir", "eval_cmd": "x"}},
            "scaleswe",
            "metadata.workdir",
        ),
        (
            {"metadata": {"image": "i", "workdir": "//", "eval_cmd": "x"}},
            "scaleswe",
            "metadata.workdir",
        ),
        ({"image": "i", "workdir": "/a/../etc", "eval_cmd": "x"}, "scaleswe", "workdir"),
        ({"image": "i", "swepro": {"parser_script": "p"}}, "scaleswe", "swepro.run_script_path"),
        (
            {
                "image": "i",
                "swepro": {"run_script": "r", "parser_script": "p", "fail_to_pass": "[1"},
            },
            "scaleswe",
            "swepro.fail_to_pass",
        ),
        (
            {
                "image": "i",
                "swepro": {"run_script": "r", "parser_script": "p", "fail_to_pass": [1]},
            },
            "scaleswe",
            "swepro.fail_to_pass[0]",
        ),
        ({"repo": "o/r", "version": "1", "base_commit": "c"}, "swebench", "test_patch"),
        (
            {"repo": "o/r", "version": 1.0, "base_commit": "c", "test_patch": "d"},
            "swebench",
            "version",
        ),
        (
            {
                "repo": "o/r",
                "version": "1",
                "base_commit": "c",
                "test_patch": "d",
                "FAIL_TO_PASS": "{}",
            },
            "swebench",
            "FAIL_TO_PASS",
        ),
        (
            {"repo": "o/r", "eval_script": "x", "log_parser": "p", "eval_type": "both"},
            "swebench",
            "eval_type",
        ),
        ({"repo": "o/r", "eval_script": "x"}, "swebench", "log_parser"),
        ({"instance_id": "a\nb", "image": "i", "eval_cmd": "x"}, "scaleswe", "instance_id"),
        # Lone surrogates (issue 9, item 8): raw, or from a JSON escape inside a string.
        ({"image": "i", "eval_cmd": "echo \ud800"}, "scaleswe", "eval_cmd"),
        (
            {"metadata": {"image": "i", "eval_cmd": "x", "problem_statement": '"\\udc80"'}},
            "scaleswe",
            "metadata.problem_statement",
        ),
        (
            {"image": "i", "eval_cmd": "x", "PASS_TO_PASS": '["t\\ud83d"]'},
            "scaleswe",
            "PASS_TO_PASS[0]",
        ),
        ({"label": "id\udfff", "metadata": {"image": "i", "eval_cmd": "x"}}, "scaleswe", "label"),
        (
            {"prompt": "fix \ud800", "metadata": {"image": "i", "eval_cmd": "x"}},
            "scaleswe",
            "prompt",
        ),
        (
            {
                "repo": "o/r",
                "eval_script": "x",
                "log_parser": "p",
                "image_assets": {"a": ["\udc00"]},
            },
            "swebench",
            "image_assets.a[0]",
        ),
        (
            {"repo": "o/r", "version": "1", "base_commit": "c", "test_patch": "d\ud800"},
            "swebench",
            "test_patch",
        ),
    ],
)
def test_bad_rows_name_the_field(row: dict[str, Any], protocol: str, field: str) -> None:
    with pytest.raises(MetadataError) as err:
        get_metadata(row, protocol)
    assert err.value.field == field
    assert str(err.value).startswith(field + ":")
    assert isinstance(err.value, ValueError)


@pytest.mark.parametrize("protocol", ["scaleswe", "swebench"])
def test_pathologically_nested_json_text_is_a_typed_error(protocol: str) -> None:
    deep = "[" * 100_000
    with pytest.raises(MetadataError):
        get_metadata({"metadata": deep}, protocol)
    with pytest.raises(MetadataError):
        get_metadata(
            {
                "repo": "o/r",
                "version": "1",
                "base_commit": "c",
                "test_patch": "d",
                "FAIL_TO_PASS": deep,
            },
            "swebench",
        )


def test_unknown_protocol_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="known protocols: scaleswe, swebench"):
        get_metadata({}, "nope")


# -- hypothesis: any row gives metadata or MetadataError ------------------------------------------
KEYS = [
    "instance_id", "image", "image_url", "workdir", "problem_statement", "swepro", "eval_cmd",
    "pre_commands", "f2p_script", "test_patch", "repo", "version", "base_commit", "FAIL_TO_PASS",
    "PASS_TO_PASS", "fail_to_pass", "pass_to_pass", "eval_script", "log_parser", "eval_type",
    "image_assets", "before_repo_set_cmd", "selected_test_files_to_run", "dockerhub_tag",
    "run_script_path", "parser_script_path", "run_script", "parser_script", "remote_env_info",
    "environment_setup_commit", "hints_text", "selected_test_files", "docker_image",
]  # fmt: skip
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=True),
    st.text(max_size=30),
    st.integers(255, 3000).map(lambda n: "x" * n),  # huge labels and ids
    st.lists(st.text(max_size=10), max_size=4).map(json.dumps),  # JSON-string lists
    st.lists(st.text(max_size=10), max_size=4).map(repr),  # Python-literal lists
    st.just("[1, 2"),
    st.just("[" * 5000),  # nested past the decoder's recursion limit
    st.just('{"a": ' * 3000),
    st.just('"quoted \\n text"'),
    st.just("lone \ud800 surrogate"),
    st.just('["json \\udc80 escape"]'),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.sampled_from(KEYS), inner, max_size=6),
    ),
    max_leaves=12,
)
flat_rows = st.dictionaries(st.sampled_from(KEYS), values, max_size=12)
rows = st.one_of(
    flat_rows,
    st.builds(
        lambda m, label, prompt: {"metadata": m, "label": label, "prompt": prompt},
        st.one_of(flat_rows, values),
        values,
        values,
    ),
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(row=rows, protocol=st.sampled_from(["scaleswe", "swebench"]))
def test_any_row_gives_metadata_or_metadata_error(row: dict[str, Any], protocol: str) -> None:
    try:
        md = get_metadata(row, protocol)
    except MetadataError as err:
        error: MetadataError | None = err
    else:
        error = None
    if error is not None:
        assert error.field
        return
    assert isinstance(md, InstanceMetadata)
    assert md.protocol == protocol
    assert isinstance(md.instance_id, str)
    assert len(md.instance_id) <= 512
    assert md.workdir.startswith("/")
    msgspec.json.encode(md)  # always serialisable
    # Never raises either (swebench's: builds the eval script with the installed swebench).
    reason = evaluability_check(md)
    assert reason is None or isinstance(reason, str)

"""What one instance is, whatever its row looked like (msgspec Structs, sans-IO).

:class:`InstanceMetadata` (image, workdir, problem statement, the protocol it was read for) holds
its protocol's grading fields: :class:`ScaleSweGrading` (with :class:`SweProSpec` for SWE-bench
Pro rows) or :class:`SweBenchGrading`. Besides the data, the few answers read off it: which
``scaleswe`` grader runs (:attr:`ScaleSweGrading.grader`), the dict swebench's
``make_test_spec`` takes (:meth:`SweBenchGrading.instance`) and the script that puts the agent's
workspace in its graded state (:meth:`InstanceMetadata.setup_script`).

Rows are read into these by ``_metadata.py``; evaluation results are in ``_result.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import msgspec

#: Where graded repositories live unless a row says otherwise (SWE-bench's Docker images).
DEFAULT_WORKDIR: Final = "/testbed"


class SweProSpec(msgspec.Struct, frozen=True, kw_only=True):
    """SWE-bench Pro grading fields (slime's ``metadata.swepro`` or a flat Pro row).

    Attributes:
        before_repo_set_cmd: shell lines run (``set -e``) in the eval sandbox before the patch.
        selected_test_files: the test files handed to the run script (comma-joined).
        fail_to_pass: tests that must pass after the patch.
        pass_to_pass: tests that must keep passing.
        run_script_path: host path of Scale's ``run_script.sh`` (or ``run_script`` inline).
        parser_script_path: host path of Scale's ``parser.py`` (or ``parser_script`` inline).
        run_script: the run script's text, when the row carries it inline.
        parser_script: the parser's text, when the row carries it inline.
    """

    before_repo_set_cmd: str = ""
    selected_test_files: tuple[str, ...] = ()
    fail_to_pass: tuple[str, ...] = ()
    pass_to_pass: tuple[str, ...] = ()
    run_script_path: str | None = None
    parser_script_path: str | None = None
    run_script: str | None = None
    parser_script: str | None = None


class ScaleSweGrading(msgspec.Struct, frozen=True, kw_only=True, tag="scaleswe"):
    """The graders of the ``scaleswe`` protocol; at most one runs, in this priority order.

    Attributes:
        swepro: SWE-bench Pro run script + parser.
        eval_cmd: a shell command run in the workdir; exit 0 means solved.
        f2p_script: a fail-to-pass pytest file (Scale-SWE); its tests and the row's
            ``pass_to_pass`` tests all passing means solved.
        pre_commands: shell lines run before the patch is applied.
        pass_to_pass: pytest ids that must keep passing (Scale-SWE's ``PASS_TO_PASS``); run
            together with the f2p script.
        fail_to_pass: the row's ``FAIL_TO_PASS`` ids, when it lists them: they give results an
            F2P/P2P split and tell an environment that ran no test from a failing patch.
        log_parser: a swebench parser name (``parse_log_pytest``...) for the ``eval_cmd`` log;
            without one, pytest's ``-rA`` summary lines are read.
    """

    swepro: SweProSpec | None = None
    eval_cmd: str | None = None
    f2p_script: str | None = None
    pre_commands: tuple[str, ...] = ()
    pass_to_pass: tuple[str, ...] = ()
    fail_to_pass: tuple[str, ...] = ()
    log_parser: str | None = None

    @property
    def grader(self) -> str | None:
        """The grader that will run (``"swepro"``, ``"eval_cmd"``, ``"f2p_script"``) or None."""
        if self.swepro is not None:
            return "swepro"
        if self.eval_cmd:
            return "eval_cmd"
        if self.f2p_script:
            return "f2p_script"
        return None


class SweBenchGrading(msgspec.Struct, frozen=True, kw_only=True, tag="swebench"):
    """The SWE-bench instance graded by the ``swebench`` protocol.

    Classic rows carry ``repo``/``version``/``base_commit``/``test_patch`` and need swebench 4.x
    to build their eval script; 5.x rows carry ``eval_script``, ``log_parser`` and ``eval_type``.
    """

    repo: str = ""
    version: str = ""
    base_commit: str = ""
    test_patch: str = ""
    fail_to_pass: tuple[str, ...] = ()
    pass_to_pass: tuple[str, ...] = ()
    environment_setup_commit: str | None = None
    hints_text: str = ""
    eval_script: str | None = None
    log_parser: str | None = None
    eval_type: str | None = None
    image_assets: Mapping[str, Any] | None = None

    @property
    def is_v5_row(self) -> bool:
        """The row carries its own eval script (the swebench 5.x dataset shape)."""
        return self.eval_script is not None

    def instance(self, instance_id: str, image: str) -> dict[str, Any]:
        """The row as the dict swebench's ``make_test_spec`` expects."""
        inst: dict[str, Any] = {
            "instance_id": instance_id,
            "repo": self.repo,
            "version": self.version,
            "base_commit": self.base_commit,
            "test_patch": self.test_patch,
            "FAIL_TO_PASS": list(self.fail_to_pass),
            "PASS_TO_PASS": list(self.pass_to_pass),
            "hints_text": self.hints_text,
            "image": image,
        }
        if self.environment_setup_commit is not None:
            inst["environment_setup_commit"] = self.environment_setup_commit
        if self.eval_script is not None:
            inst["eval_script"] = self.eval_script
            inst["log_parser"] = self.log_parser or ""
            inst["eval_type"] = self.eval_type or "pass_and_fail"
            if self.image_assets:
                inst["image_assets"] = dict(self.image_assets)
        return inst


class InstanceMetadata(msgspec.Struct, frozen=True, kw_only=True):
    """Everything needed to boot and grade one instance, whatever the row looked like.

    Attributes:
        protocol: the grading protocol this metadata was read for.
        instance_id: the instance's id (``"unknown"`` when the row has none).
        image: the sandbox image (local backend: a directory or ``path@commit``).
        workdir: the repository's path inside the sandbox.
        problem_statement: the task text shown to the agent.
        grading: the protocol's grading fields.
        mismatch: set when the row looks like another protocol's (``protocol_row_mismatch:...``).
        extra: free-form fields for protocols registered by users.
    """

    protocol: str
    instance_id: str
    image: str
    workdir: str = DEFAULT_WORKDIR
    problem_statement: str = ""
    grading: ScaleSweGrading | SweBenchGrading | None = None
    mismatch: str | None = None
    extra: Mapping[str, Any] = msgspec.field(default_factory=dict)

    def setup_script(self) -> str | None:
        """The script that puts the agent's workspace in its graded state, or None.

        It runs (``set -e``) before the agent starts: SWE-bench Pro's ``before_repo_set_cmd``,
        then the row's ``pre_commands``. Rows of other protocols have none.
        """
        grading = self.grading
        if not isinstance(grading, ScaleSweGrading):
            return None
        lines: list[str] = []
        before = grading.swepro.before_repo_set_cmd if grading.swepro is not None else ""
        if before.strip():
            lines.append(before)
        lines.extend(c for c in grading.pre_commands if c and c.strip())
        if not lines:
            return None
        return "set -e\n" + "\n".join(lines) + "\n"

"""Grading's entry points: read a row, check it can be graded, grade a patch."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import msgspec

from .._errors import ConfigError, MetadataError
from ..sandbox._images import check_image, image_for
from ._patch import patch_bytes
from ._registry import get_protocol, register_protocol
from ._result import EvalResult, Graded
from ._scaleswe import ScaleSweProtocol
from ._swebench import SweBenchProtocol
from ._types import InstanceMetadata, SweBenchGrading

if TYPE_CHECKING:
    from ..sandbox import Backend

register_protocol("scaleswe", ScaleSweProtocol())
register_protocol("swebench", SweBenchProtocol())


def get_metadata(row: Mapping[str, Any] | Any, protocol: str = "scaleswe") -> InstanceMetadata:
    """Read a dataset row for ``protocol``.

    Accepts slime-style samples (``prompt``/``label``/``metadata`` with ``remote_env_info``, as
    a mapping or an object with those attributes), SWE-bench rows (classic and 5.x), SWE-bench
    Pro rows and Scale-SWE rows.

    Raises:
        MetadataError: a field is missing or malformed; ``err.field`` names it.
        ConfigError: ``protocol`` is not registered.
    """
    return get_protocol(protocol).get_metadata(_as_mapping(row))


def evaluability_check(md: InstanceMetadata, backend: Backend | None = None) -> str | None:
    """A reason ``md`` cannot be graded (checked before an episode starts), or None.

    Cheap and free of I/O except that the swebench protocol builds its eval script eagerly.
    With ``backend``, also what that backend would boot for the row (its ``image_for`` hook)
    is checked by the backend (its ``check_image``: e.g. the local backend resolves
    ``path@commit`` and checks that the checkout is the row's ``base_commit``; E2B refuses Docker
    image names).
    """
    reason = get_protocol(md.protocol).evaluability_check(md)
    if reason is not None or backend is None:
        return reason
    return check_image(backend, image_for(backend, md), commit=expected_commit(md))


def resolve_image(backend: Backend, md: InstanceMetadata) -> InstanceMetadata:
    """``md`` with the image ``backend`` boots for it (its ``image_for`` hook, if any)."""
    image = image_for(backend, md)
    return md if image == md.image else msgspec.structs.replace(md, image=image)


def expected_commit(md: InstanceMetadata) -> str | None:
    """The commit the instance image must have checked out (SWE-bench's ``base_commit``)."""
    g = md.grading
    if isinstance(g, SweBenchGrading) and g.base_commit:
        return g.base_commit
    return None


def local_checkouts(root: str | os.PathLike[str]) -> Callable[[InstanceMetadata], str | None]:
    """An ``images=`` mapping for ``LocalBackend``: SWE-bench rows boot from local clones.

    A row of ``owner/name`` at ``base_commit`` boots ``<root>/<owner>__<name>@<base_commit>``
    (SWE-bench's own ``owner__name`` spelling); rows without ``repo``/``base_commit`` keep
    their image.
    """
    base = os.path.abspath(root)

    def image(md: InstanceMetadata) -> str | None:
        g = md.grading
        if isinstance(g, SweBenchGrading) and g.repo and g.base_commit:
            return f"{base}/{g.repo.replace('/', '__')}@{g.base_commit}"
        return None

    return image


async def grade(
    backend: Backend, md: InstanceMetadata, patch: str | bytes, *, timeout_sec: float
) -> Graded:
    """Grade ``patch`` for ``md`` in a fresh sandbox, which is opened and killed here: the
    result and what the grading ran and saw (:class:`~trio_swe.grading.EvalArtifacts`: the eval
    script, the whole test output, the per-instance report), for whoever writes the SWE-bench
    harness's files (:class:`~trio_swe.grading.HarnessOutputs`).

    Args:
        backend: where the eval sandbox comes from.
        md: the instance, from :func:`get_metadata`.
        patch: a unified diff (``git diff --binary`` output), bytes or str; empty means no
            change. Bytes are applied as they are (any encoding); a str is encoded as UTF-8.
        timeout_sec: the test run's time budget; overrunning it gives ``tests_timeout``.

    Returns:
        What was graded; task outcomes (failing tests, a patch that does not apply, a timeout)
        are results with reward 0, never exceptions.

    Raises:
        InvalidArgumentError: ``patch`` is neither str nor bytes, or a str with a lone
            surrogate (no encoding can write it).
        SandboxError: the eval sandbox failed (infrastructure).
    """
    patch_bytes(patch)  # checked before any sandbox boots, whatever the protocol
    return await get_protocol(md.protocol).grade(backend, md, patch, timeout_sec=timeout_sec)


async def run_evaluation(
    backend: Backend, md: InstanceMetadata, patch: str | bytes, *, timeout_sec: float
) -> EvalResult:
    """:func:`grade`'s result alone (same arguments and errors)."""
    return (await grade(backend, md, patch, timeout_sec=timeout_sec)).result


def check_rows(rows: Iterable[Mapping[str, Any] | Any], protocol: str) -> None:
    """Fail fast if this install cannot grade rows of the shapes in ``rows`` (start-up check).

    One row of each shape (classic SWE-bench, 5.x with ``eval_script``, other) is checked with
    :func:`evaluability_check`; a reason that installing another swebench fixes (swebench
    missing, a classic row on swebench 5.x, a 5.x row whose parser swebench 4.x lacks) raises.
    Other reasons are per-row outcomes (``unevaluable``) and are left to the episodes; rows that
    cannot be read are skipped here.

    Raises:
        ConfigError: naming the row, what is wrong and the command that fixes it.
    """
    from ._swebench_api import VERSION_REASONS

    seen: set[str] = set()
    for row in rows:
        try:
            md = get_metadata(row, protocol)
        except MetadataError:
            continue
        g = md.grading
        shape = ("v5" if g.is_v5_row else "classic") if isinstance(g, SweBenchGrading) else "other"
        if shape in seen:
            continue
        seen.add(shape)
        reason = evaluability_check(md)
        if reason is not None and reason.startswith(VERSION_REASONS):
            raise ConfigError(
                f"grading protocol {protocol!r} cannot grade this dataset: row "
                f"{md.instance_id!r} ({shape} shape): {reason}"
            )


def _as_mapping(row: Mapping[str, Any] | Any) -> Mapping[str, Any]:
    if isinstance(row, Mapping):
        return row
    # A slime ``Sample`` (or any object with these attributes).
    if hasattr(row, "metadata"):
        return {k: getattr(row, k) for k in ("prompt", "label", "metadata") if hasattr(row, k)}
    raise MetadataError("row", f"expected a mapping or a sample, got {type(row).__name__}")

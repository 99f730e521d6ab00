"""Results files: one length-prefixed msgpack frame per :class:`~trio_swe.EpisodeResult`.

:class:`ResultsWriter` appends each result (with its samples, encoded by
:func:`~trio_swe.encode_sample`) the moment it is ready and flushes it, so a killed process loses
at most the frame it was writing; reopening the file drops that cut frame and resumes.
:func:`read_results` is the public reader: it returns every intact frame. ``trio-swe run``
writes these files; ``trio-swe results`` reads them and exports them as JSON Lines
(:func:`results_jsonl`) or as SWE-bench's ``predictions.jsonl`` (:func:`predictions_jsonl`).
:func:`group_advantages` computes GRPO's group-normalised advantages from the results alone.
"""

from __future__ import annotations

import math
import os
import struct
from collections.abc import Callable, Iterable

import msgspec

from .episode import EpisodeResult
from .grading import HarnessOutputs
from .trajectory import decode_sample, encode_sample, encode_sample_json

__all__ = [
    "ResultsWriter",
    "decode_result",
    "encode_result",
    "group_advantages",
    "harness_record",
    "predictions_jsonl",
    "read_results",
    "results_jsonl",
]

_FRAME_HEADER = struct.Struct(">I")


class _Frame(msgspec.Struct, array_like=True):
    result: EpisodeResult
    samples: list[bytes]


_frame_decoder = msgspec.msgpack.Decoder(_Frame)


def encode_result(result: EpisodeResult) -> bytes:
    """One length-prefixed msgpack frame: the result, its samples encoded by ``encode_sample``."""
    frame = _Frame(
        # The grading's artifacts (whole test logs) go to the harness's files, not here.
        result=msgspec.structs.replace(result, samples=[], eval_artifacts=None),
        samples=[encode_sample(s) for s in result.samples],
    )
    body = msgspec.msgpack.encode(frame)
    return _FRAME_HEADER.pack(len(body)) + body


def decode_result(frame: bytes | memoryview) -> EpisodeResult:
    """The result in one frame made by :func:`encode_result` (samples decoded).

    Raises:
        msgspec.DecodeError: the bytes are not one whole frame.
    """
    view = memoryview(frame)
    if len(view) < _FRAME_HEADER.size:
        raise msgspec.DecodeError("a result frame is at least 4 bytes")
    (size,) = _FRAME_HEADER.unpack_from(view, 0)
    if len(view) != _FRAME_HEADER.size + size:
        raise msgspec.DecodeError(f"a result frame of {size} bytes has {len(view) - 4}")
    decoded = _frame_decoder.decode(view[_FRAME_HEADER.size :])
    decoded.result.samples = [decode_sample(s) for s in decoded.samples]
    return decoded.result


def read_results(path: str | os.PathLike[str]) -> tuple[list[EpisodeResult], int]:
    """The results in a results file, and the length of its intact prefix in bytes.

    A frame cut short (the writer was killed midway) ends the intact prefix; everything before
    it is returned. A missing file has no results.
    """
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return [], 0
    results: list[EpisodeResult] = []
    pos = 0
    while pos + _FRAME_HEADER.size <= len(data):
        (size,) = _FRAME_HEADER.unpack_from(data, pos)
        end = pos + _FRAME_HEADER.size + size
        if end > len(data):
            break
        try:
            frame = _frame_decoder.decode(data[pos + _FRAME_HEADER.size : end])
        except msgspec.DecodeError:
            break
        frame.result.samples = [decode_sample(s) for s in frame.samples]
        results.append(frame.result)
        pos = end
    return results, pos


class ResultsWriter:
    """Appends results to a file, one frame each, flushed as it goes; resumable.

    Opening an existing file keeps its intact frames (and drops a frame cut short by an
    interrupted writer), so a rerun continues where the last one stopped.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self.previous, intact = read_results(self.path)
        self._file = open(self.path, "ab")  # noqa: SIM115  (closed by close())
        self._file.truncate(intact)
        self._file.seek(intact)
        self.written = 0

    def keep_only(self, keep: Callable[[EpisodeResult], bool]) -> None:
        """Rewrite the file with the previous results ``keep`` accepts (atomically).

        ``trio-swe run`` drops the aborted frames of the instances it runs again, so a rerun
        leaves one frame per attempt that counts, not one more per abort.
        """
        kept = [r for r in self.previous if keep(r)]
        if len(kept) == len(self.previous):
            return
        tmp = f"{self.path}.tmp-{os.getpid()}"
        with open(tmp, "wb") as f:
            for result in kept:
                f.write(encode_result(result))
            f.flush()
            os.fsync(f.fileno())
        self._file.close()
        os.replace(tmp, self.path)
        self._file = open(self.path, "ab")  # noqa: SIM115  (closed by close())
        self.previous = kept

    def write(self, result: EpisodeResult) -> None:
        """Append ``result`` and flush it to the OS (it survives the process being killed)."""
        self._file.write(encode_result(result))
        self._file.flush()
        self.written += 1

    def write_frame(self, frame: bytes) -> None:
        """Append a frame already made by :func:`encode_result` (e.g. by a remote worker)."""
        self._file.write(frame)
        self._file.flush()
        self.written += 1

    def close(self) -> None:
        """Sync and close the file."""
        if not self._file.closed:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()

    def __enter__(self) -> ResultsWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --- exports ---------------------------------------------------------------------------------


def results_jsonl(results: Iterable[EpisodeResult], *, samples: bool = False) -> list[bytes]:
    """One JSON line per result (its samples left out unless ``samples``: they are large)."""
    lines = []
    for result in results:
        doc = msgspec.to_builtins(msgspec.structs.replace(result, samples=[]), enc_hook=_enc_hook)
        doc["patch"] = result.patch_text
        doc["n_samples"] = len(result.samples)
        if samples:
            doc["samples"] = [msgspec.json.decode(encode_sample_json(s)) for s in result.samples]
        else:
            doc.pop("samples", None)
        lines.append(msgspec.json.encode(doc) + b"\n")
    return lines


def predictions_jsonl(results: Iterable[EpisodeResult], *, model: str) -> list[bytes]:
    """SWE-bench's ``predictions.jsonl``: ``instance_id``, ``model_name_or_path``, ``model_patch``.

    One line per instance: its last episode that was not aborted (an aborted episode's patch
    says nothing about the model). Instances appear in the order they first finished.
    """
    last: dict[str, EpisodeResult] = {}
    for result in results:
        if result.status != "aborted":
            last[result.instance_id] = result
    return [
        msgspec.json.encode(
            {
                "instance_id": r.instance_id,
                "model_name_or_path": model,
                "model_patch": r.patch_text,
            }
        )
        + b"\n"
        for r in last.values()
    ]


def harness_record(outputs: HarnessOutputs, result: EpisodeResult) -> None:
    """Write ``result``'s grading into the SWE-bench harness's files (its instance folder).

    Needs the grading's artifacts (``keep_eval_artifacts=True`` on the run) for ``eval.sh``,
    ``test_output.txt`` and ``report.json``. An episode that never reached grading writes
    nothing (the run report counts its instance as incomplete); one whose grading failed
    writes its folder with the error.
    """
    patch = result.patch.decode("utf-8", "surrogateescape")
    if result.eval_result is not None:
        outputs.record(result.instance_id, patch, result.eval_result, result.eval_artifacts)
    elif result.abort_reason == "eval_infrastructure":
        outputs.record(result.instance_id, patch, None, None, note=result.error or "")


def group_advantages(results: Iterable[EpisodeResult], *, eps: float = 1e-6) -> dict[str, float]:
    """GRPO's advantages: ``(reward - group mean) / (group std + eps)``, by ``episode_id``.

    Groups are the results' ``group_id`` (:attr:`EpisodeResult.group`); nothing else is needed
    (no join with the instances). Aborted episodes (infrastructure failures) are left out of
    their group's statistics and get no advantage: their 0 reward is not the model's. When a
    group member was run more than once (a rerun of a resumed file), its last finished result
    counts. The std is the population's (ddof 0): a group of one, or of equal rewards, gets
    advantages 0.
    """
    members: dict[str, dict[int, EpisodeResult]] = {}
    for result in results:
        if result.status != "aborted":
            members.setdefault(result.group, {})[result.group_index] = result
    advantages: dict[str, float] = {}
    for group in members.values():
        rewards = [r.reward for r in group.values()]
        mean = math.fsum(rewards) / len(rewards)
        std = math.sqrt(math.fsum((x - mean) ** 2 for x in rewards) / len(rewards))
        scale = std + eps
        for r in group.values():
            advantages[r.episode_id] = (r.reward - mean) / scale if scale else 0.0
    return advantages


def _enc_hook(obj: object) -> object:
    if isinstance(obj, bytes):
        return obj.decode("utf-8", errors="replace")
    raise NotImplementedError(type(obj))

"""What crosses Ray between the driver and a worker: msgpack buffers, never pickled objects.

A job (the instance's metadata and the episode's options) goes in as one msgpack buffer; the
result comes back as the very frame a results file stores (:func:`trio_swe.results.encode_result`:
the result, its samples as :func:`~trio_swe.encode_sample` buffers), so the driver can decode it
or append it to a results file as it is. An empty reply means the episode was cancelled.
"""

from __future__ import annotations

from typing import Any

import msgspec

from ..config import SweConfig
from ..grading import InstanceMetadata

__all__ = ["Job", "decode_job", "encode_job"]


class Job(msgspec.Struct, array_like=True, frozen=True):
    """One episode to run on a worker.

    Attributes:
        key: unique per dispatch (a rerun after a worker died gets a new key).
        batch: the driver-side call it belongs to (cancelled together).
        md: the instance.
        episode_id: the episode's id (None: the worker makes a fresh one).
        sampling_params: SGLang sampling parameters for every policy call.
        network: whether agent sandboxes get network access.
        build_samples: whether to build samples.
        group_id: the episode's group (None: its instance id).
        group_index: its place in the group.
    """

    key: str
    batch: str
    md: InstanceMetadata
    episode_id: str | None = None
    sampling_params: dict[str, Any] | None = None
    network: bool = True
    build_samples: bool = True
    group_id: str | None = None
    group_index: int = 0


_job_decoder = msgspec.msgpack.Decoder(Job)
_config_decoder = msgspec.msgpack.Decoder(SweConfig)


def encode_job(job: Job) -> bytes:
    return msgspec.msgpack.encode(job)


def decode_job(raw: bytes) -> Job:
    return _job_decoder.decode(raw)


def encode_config(config: SweConfig) -> bytes:
    return msgspec.msgpack.encode(config)


def decode_config(raw: bytes) -> SweConfig:
    return _config_decoder.decode(raw)

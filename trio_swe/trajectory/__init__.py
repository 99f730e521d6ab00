"""Trajectories to training samples: records, the sample builder, truncation and codecs.

Sans-IO except for the file helpers: :class:`TurnRecord` and :class:`Sample` are frozen msgspec
Structs over typed read-only buffers; :class:`TurnRecorder` makes a chain's records over one
append-only history (each token converted once); :class:`SampleBuilder` turns a chain of turns into
samples (clean / realign / fork); :func:`truncate` cuts a sample by slicing; the codecs write
msgpack (decoded as views), JSON (for people) and streams of samples to files.
"""

from .._errors import SampleDecodeError
from ._builder import BuilderStatistics, SampleBuilder, TurnKind
from ._codec import (
    decode_sample,
    decode_sample_json,
    encode_sample,
    encode_sample_json,
    read_samples,
    write_samples,
)
from ._recorder import RecorderStatistics, TurnRecorder
from ._records import Sample, SampleArrays, SampleStatus, TurnRecord
from ._truncate import truncate

__all__ = [
    "BuilderStatistics",
    "RecorderStatistics",
    "Sample",
    "SampleArrays",
    "SampleBuilder",
    "SampleDecodeError",
    "SampleStatus",
    "TurnKind",
    "TurnRecord",
    "TurnRecorder",
    "decode_sample",
    "decode_sample_json",
    "encode_sample",
    "encode_sample_json",
    "read_samples",
    "truncate",
    "write_samples",
]

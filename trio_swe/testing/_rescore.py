"""Re-score token sequences with a checkpoint's own weights in torch: the trainer's side of the
proof that rollout log-probs are what the engine sampled.

Run in the engine's environment (torch and transformers): ``python -m trio_swe.testing._rescore
CHECKPOINT < requests.msgpack > log_probs.msgpack``. A request is ``{"tokens": [...],
"temperature": T}``; the answer for it is the float32 log-prob of each token given those before
it under ``log_softmax(logits / T)`` (the first token has none: NaN), as raw little-endian bytes.
:func:`rescore` calls it from the project's environment, where torch is not.
"""

from __future__ import annotations

import subprocess
import sys
from array import array
from collections.abc import Sequence
from pathlib import Path

import msgspec

from ._engine import _OFFLINE, engine_python


class RescoreRequest(msgspec.Struct):
    tokens: list[int]
    temperature: float = 1.0


def rescore(
    checkpoint: Path, requests: Sequence[RescoreRequest], *, python: Path | None = None
) -> list[array[float]]:
    """Each request's per-token log-probs (``array('f')``, NaN first), from a subprocess in the
    engine's environment.

    Raises:
        RuntimeError: the subprocess failed (its stderr's end in the message).
    """
    import os

    done = subprocess.run(
        [str(python or engine_python()), "-m", "trio_swe.testing._rescore", str(checkpoint)],
        input=msgspec.msgpack.encode(list(requests)),
        capture_output=True,
        env={**os.environ, **_OFFLINE},
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"rescore failed: {done.stderr.decode(errors='replace')[-2000:]}")
    out = []
    for raw in msgspec.msgpack.decode(done.stdout, type=list[bytes]):
        values = array("f")
        values.frombytes(raw)
        out.append(values)
    return out


def _main() -> None:  # pragma: no cover - runs in the engine's environment
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_grad_enabled(False)
    model = AutoModelForCausalLM.from_pretrained(sys.argv[1], torch_dtype=torch.float32)
    model.eval()
    requests = msgspec.msgpack.decode(sys.stdin.buffer.read(), type=list[RescoreRequest])
    answers = []
    for request in requests:
        ids = torch.tensor([request.tokens], dtype=torch.long)
        logits = model(ids).logits[0, :-1].float() / request.temperature
        picked = torch.log_softmax(logits, dim=-1).gather(1, ids[0, 1:, None])[:, 0]
        values = torch.cat([torch.tensor([float("nan")]), picked]).to(torch.float32)
        answers.append(values.numpy().tobytes())
    sys.stdout.buffer.write(msgspec.msgpack.encode(answers))


if __name__ == "__main__":
    _main()

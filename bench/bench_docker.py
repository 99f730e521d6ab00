"""DockerBackend and daemonless OCI images, each beside the tool people use today, in one run.

Starts its own dockerd and registry (tests/dockerenv.py: loopback only, stopped at the end) and
builds the SWE-bench-shaped test image (base + env + instance + deletions, ~85 MB, 4 layers).

1. A container's life: boot + ``exec`` of ``python3 -V; git --version`` + remove, through
   ``DockerBackend`` vs the docker CLI (``docker run -d``, ``docker exec``, ``docker rm -f``).
2. Getting the image: pull + unpack into a fresh cache (``OciStore``) vs ``docker pull`` into a
   daemon that has none of its layers, and vs ``skopeo copy`` + ``umoci unpack`` when installed.
3. Boot + ``exec true`` + kill of the image, already local: the local backend (overlay of the
   unpacked layers, bwrap) vs a Docker container (DockerBackend).
4. ``write_file`` of 4 KiB as ``agent`` vs as root, in one container: the price of a user's
   write checked by the kernel (staged, then the write script run as the user) over the archive
   API's one request.

Rounds alternate between the two sides of each ratio; figures are medians.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import trio

from tests.dockerenv import DockerEnv, docker_env
from trio_swe import LocalBackend, open_sandbox
from trio_swe.sandbox.docker import DockerBackend
from trio_swe.sandbox.oci import OciStore

ROUNDS = 7
PULL_ROUNDS = 3
CMD = "python3 -V; git --version"


def med(xs: list[float]) -> float:
    return statistics.median(xs)


def row(name: str, ours: list[float], theirs: list[float], base: str) -> None:
    print(
        f"{name:<44} ours {med(ours) * 1000:8.0f} ms   {base} {med(theirs) * 1000:8.0f} ms"
        f"   ratio {med(theirs) / med(ours):5.2f}x"
    )


def timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


async def lifecycle(env: DockerEnv) -> None:
    image = env.base_image
    ours: list[float] = []
    cli: list[float] = []
    async with DockerBackend(host=env.docker_host) as backend:
        async with open_sandbox(backend, image) as sb:  # warm: version, sweep, image check
            await sb.exec("true")
        for _ in range(ROUNDS):
            t0 = time.perf_counter()
            async with open_sandbox(backend, image) as sb:
                r = await sb.exec(CMD)
                assert r.ok, r
            ours.append(time.perf_counter() - t0)

            def by_cli() -> None:
                cid = env.docker("run", "-d", "--network", "none", image, "sleep", "600").strip()
                env.docker("exec", cid, "bash", "-c", CMD)
                env.docker("rm", "-f", cid)

            cli.append(await trio.to_thread.run_sync(timed, by_cli))
    row("boot + exec + remove: DockerBackend vs CLI", ours, cli, "docker CLI")


async def pulls(env: DockerEnv, scratch: Path) -> None:
    ours: list[float] = []
    theirs: list[float] = []
    tools: list[float] = []
    have_tools = bool(shutil.which("skopeo") and shutil.which("umoci"))
    ref = env.swe_image
    # The daemon must not have any of the image's layers, or `docker pull` skips them.
    for other in (env.base_image, env.swe_image_b):
        env.docker("rmi", other, check=False)
    for i in range(PULL_ROUNDS):
        cache = scratch / f"oci{i}"
        store = OciStore(cache)
        t0 = time.perf_counter()
        await store.get(ref)
        ours.append(time.perf_counter() - t0)
        await trio.to_thread.run_sync(shutil.rmtree, cache)

        env.docker("rmi", ref, check=False)
        theirs.append(await trio.to_thread.run_sync(timed, lambda: env.docker("pull", "-q", ref)))

        if have_tools:
            layout, bundle = scratch / f"layout{i}", scratch / f"bundle{i}"

            def skopeo_umoci(layout: Path = layout, bundle: Path = bundle) -> None:
                subprocess.run(
                    ["skopeo", "copy", "-q", "--src-tls-verify=false", f"docker://{ref}",
                     f"oci:{layout}:img"], check=True, capture_output=True,
                )  # fmt: skip
                subprocess.run(
                    ["umoci", "unpack", "--image", f"{layout}:img", str(bundle)],
                    check=True, capture_output=True,
                )  # fmt: skip

            tools.append(await trio.to_thread.run_sync(timed, skopeo_umoci))
            shutil.rmtree(layout, ignore_errors=True)
            shutil.rmtree(bundle, ignore_errors=True)
    row("pull + unpack (85 MB, 4 layers) vs docker pull", ours, theirs, "docker pull")
    if tools:
        row("pull + unpack vs skopeo copy + umoci unpack", ours, tools, "skopeo+umoci")
    else:
        print("skopeo/umoci not installed: that comparison is skipped")


async def boots(env: DockerEnv, scratch: Path) -> None:
    local = LocalBackend(oci_cache_dir=scratch / "oci-warm", state_dir=scratch / "state")
    ours: list[float] = []
    theirs: list[float] = []
    async with DockerBackend(host=env.docker_host) as docker:
        for backend in (local, docker):  # warm both: the image unpacked / present
            async with open_sandbox(backend, env.swe_image) as sb:
                await sb.exec("true")
        for _ in range(ROUNDS):
            for backend, out in ((local, ours), (docker, theirs)):
                t0 = time.perf_counter()
                async with open_sandbox(backend, env.swe_image) as sb:
                    r = await sb.exec("true")
                    assert r.ok, r
                out.append(time.perf_counter() - t0)
    row("boot + exec true + kill: local OCI vs Docker", ours, theirs, "docker")


async def writes(env: DockerEnv) -> None:
    data = b"x" * 4096
    as_agent: list[float] = []
    as_root: list[float] = []
    async with (
        DockerBackend(host=env.docker_host) as backend,
        open_sandbox(backend, env.base_image) as sb,
    ):
        await sb.write_file("/tmp/w/warm", data, user="agent")  # warm: ids looked up, parents
        await sb.write_file("/tmp/r/warm", data)
        for i in range(3 * ROUNDS):
            for user, out, path in (("agent", as_agent, "/tmp/w"), (None, as_root, "/tmp/r")):
                t0 = time.perf_counter()
                await sb.write_file(f"{path}/f{i}", data, user=user)
                out.append(time.perf_counter() - t0)
    row("write_file 4 KiB: as root vs as agent", as_root, as_agent, "as agent")


async def run() -> None:
    with docker_env() as env, tempfile.TemporaryDirectory(prefix="bench-docker-") as tmp:
        scratch = Path(tmp)
        print(
            f"daemon {env.docker_host}, registry {env.registry}, {ROUNDS} rounds (pulls {PULL_ROUNDS})"
        )
        await lifecycle(env)
        await boots(env, scratch)
        await pulls(env, scratch)
        await writes(env)


def main() -> None:
    trio.run(run)


if __name__ == "__main__":
    main()

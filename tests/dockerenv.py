"""A real Docker daemon and a real registry for the tests, both on this machine only.

``dockerd`` runs with its own data root, exec root, socket and pidfile under a temp dir, with
``--iptables=false --ip6tables=false --bridge=none`` (no bridge, no NAT rules: containers get
only ``lo``); ``docker-registry`` listens on 127.0.0.1 with its storage in the same temp dir.
Images are built offline, ``FROM scratch``, from a root file system assembled from host files
(bash, python3, git, coreutils and their libraries), shaped like SWE-bench's: a base layer, an
env layer (``/opt/miniconda3/bin/activate`` and a ``testbed`` env with pytest), an instance layer
(the repository at ``/testbed``) and a layer of deletions that docker records as whiteouts.

pytest-xdist workers share one daemon: the first to take the lock starts it and builds the
images, the others reuse them, and the last worker out stops both daemons by pid.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

# Tools the images carry (those of them the host has), with every library they load.
_TOOLS = (  # noqa: SIM905
    "bash sh dash python3 python3.11 git env ls cat cp mv rm mkdir rmdir ln chmod chown touch "
    "echo printf test [ true false sleep id whoami dirname basename head tail wc sort uniq tr cut "
    "tee stat date mktemp readlink realpath uname tar gzip diff patch find xargs grep sed flock "
    "setsid kill nproc timeout seq expr du md5sum sha256sum od base64 nohup pwd yes cmp nice "
    "getent hostname ps"
).split()
_PY_SKIP = {"test", "__pycache__", "dist-packages", "idlelib", "tkinter", "turtledemo", "ensurepip",
            "lib2to3", "pydoc_data", "unittest/test", "config-3.11-x86_64-linux-gnu"}  # fmt: skip
# pytest and its dependencies, copied from the test environment into the image's testbed env.
_PYTEST_PKGS = ("pytest", "_pytest", "pluggy", "iniconfig", "packaging", "pygments", "py.py")

ACTIVATE = """\
# A stand-in for Miniconda's activate: `conda activate NAME` puts envs/NAME/bin first on PATH.
conda() {
  case "$1" in
    activate)
      _p=/opt/miniconda3/envs/${2:-base}
      [ -d "$_p" ] || { echo "conda: no env ${2:-base}" >&2; return 1; }
      export CONDA_DEFAULT_ENV=${2:-base} CONDA_PREFIX=$_p PATH=$_p/bin:$PATH ;;
    deactivate) unset CONDA_DEFAULT_ENV CONDA_PREFIX ;;
    *) echo "conda $1: not in this image" >&2; return 1 ;;
  esac
}
"""

#: What the whiteout layer deletes: a file, a directory, and a directory replaced (opaque).
WHITEOUT_RUN = (
    "rm /usr/bin/cmp && rm -rf /usr/lib/python3.11/email/mime && "
    "rm -rf /usr/share/git-core/templates && mkdir -p /usr/share/git-core/templates && "
    "echo new > /usr/share/git-core/templates/NEW"
)


#: The environment of the running session (set by the ``docker_env`` fixture).
ACTIVE: DockerEnv | None = None


class DockerUnavailable(Exception):
    """The daemon or the registry cannot run here (the reason is the message)."""


@dataclass(frozen=True)
class DockerEnv:
    """What the tests get: the daemon's socket, the registry's address, the images built."""

    root: Path
    docker_host: str  # unix://...
    registry: str  # 127.0.0.1:PORT
    base_image: str  # the base layer alone (bash, python3, git, coreutils)
    swe_image: str  # base + env + instance (calc at /testbed) + whiteouts, SWE-bench's shape
    swe_image_b: str  # the same base and env, another instance layer
    calc_base: str  # the calc repository's base commit inside swe_image

    @property
    def socket_path(self) -> str:
        return self.docker_host.removeprefix("unix://")

    def docker(self, *args: str, check: bool = True, timeout: float = 600) -> str:
        """Run the docker CLI against this daemon."""
        env = {**os.environ, "DOCKER_HOST": self.docker_host, "DOCKER_BUILDKIT": "0"}
        out = subprocess.run(
            ["docker", *args], env=env, capture_output=True, text=True, timeout=timeout
        )
        if check and out.returncode != 0:
            raise RuntimeError(f"docker {' '.join(args)}: {out.stderr.strip()}")
        return out.stdout

    def containers(self, label: str = "trio_swe.sandbox") -> list[str]:
        """Ids of containers (running or not) carrying ``label``."""
        return self.docker("ps", "-aq", "--filter", f"label={label}").split()

    def own_containers(self) -> list[str]:
        """Containers of ours made by this process (tests in other workers have their own)."""
        return [
            c
            for c in self.docker(
                "ps",
                "-a",
                "--filter",
                "label=trio_swe.sandbox",
                "--format",
                '{{.ID}} {{.Label "trio_swe.owner"}}',
            ).splitlines()
            if c.split(" ", 1)[-1].split("/")[2:3] == [str(os.getpid())]
        ]


def _ldd(paths: list[Path]) -> set[Path]:
    libs: set[Path] = set()
    for i in range(0, len(paths), 200):
        out = subprocess.run(
            ["ldd", *map(str, paths[i : i + 200])], capture_output=True, text=True, check=False
        ).stdout
        for line in out.splitlines():
            parts = line.split()
            for p in parts:
                if p.startswith("/") and os.path.exists(p):
                    libs.add(Path(p))
    return libs


def _copy(src: Path, root: Path) -> None:
    """Copy host file ``src`` to the same path under ``root`` (symlink chains followed into it)."""
    rel = Path(str(src).lstrip("/"))
    dest = root / rel
    if dest.exists() or dest.is_symlink():
        return
    dest.parent.mkdir(parents=True, exist_ok=True)
    if src.is_symlink():
        target = os.readlink(src)
        dest.symlink_to(target)
        _copy((src.parent / target).resolve() if not target.startswith("/") else Path(target), root)
    else:
        shutil.copy2(src, dest)


def build_rootfs(root: Path) -> None:
    """A minimal merged-/usr root file system from host files (about 1-2 s)."""
    for name, target in (("bin", "usr/bin"), ("sbin", "usr/sbin"), ("lib", "usr/lib"),
                         ("lib64", "usr/lib64")):  # fmt: skip
        (root / target).mkdir(parents=True, exist_ok=True)
        (root / name).symlink_to(target)
    elfs: list[Path] = []
    for tool in _TOOLS:
        host = Path("/usr/bin") / tool
        if not host.exists():
            host = Path("/usr/sbin") / tool
        if not host.exists():
            continue
        _copy(host, root)
        elfs.append(host.resolve())
    py = Path("/usr/lib/python3.11")
    for dirpath, dirnames, filenames in os.walk(py):
        rel = Path(dirpath).relative_to(py)
        dirnames[:] = [d for d in dirnames if str(rel / d) not in _PY_SKIP and d not in _PY_SKIP]
        for f in filenames:
            _copy(Path(dirpath) / f, root)
            if f.endswith(".so"):
                elfs.append(Path(dirpath) / f)
    for d in ("/usr/lib/git-core", "/usr/share/git-core", "/usr/lib/locale/C.utf8"):
        for dirpath, _dirs, filenames in os.walk(d):
            for f in filenames:
                p = Path(dirpath) / f
                _copy(p, root)
                if p.suffix == "" and os.access(p, os.X_OK) and not p.is_symlink():
                    elfs.append(p)
    for lib in _ldd(elfs):
        _copy(lib, root)
    loader = Path("/lib64/ld-linux-x86-64.so.2").resolve()
    dest = root / "usr/lib64/ld-linux-x86-64.so.2"
    if dest.is_symlink():
        dest.unlink()
    if not dest.exists():
        shutil.copy2(loader, dest)
    etc = root / "etc"
    etc.mkdir(exist_ok=True)
    (etc / "passwd").write_text(
        "root:x:0:0:root:/root:/bin/bash\nagent:x:1000:1000::/home/agent:/bin/bash\n"
    )
    (etc / "group").write_text("root:x:0:\nagent:x:1000:\n")
    for d, mode in (("tmp", 0o1777), ("proc", 0o755), ("sys", 0o755), ("dev", 0o755),
                    ("root", 0o700), ("testbed", 0o755), ("home/agent", 0o755)):  # fmt: skip
        (root / d).mkdir(parents=True, exist_ok=True)
        (root / d).chmod(mode)
    os.chown(root / "home/agent", 1000, 1000)


def build_env_tree(root: Path) -> None:
    """``/opt/miniconda3``: activate, and a ``testbed`` env (a venv of the image's python3 with pytest)."""
    conda = root / "opt/miniconda3"
    (conda / "bin").mkdir(parents=True)
    (conda / "bin/activate").write_text(ACTIVATE)
    env = conda / "envs/testbed"
    (env / "bin").mkdir(parents=True)
    (env / "bin/python").symlink_to("/usr/bin/python3.11")
    (env / "bin/python3").symlink_to("python")
    (env / "pyvenv.cfg").write_text("home = /usr/bin\ninclude-system-site-packages = false\n")
    site = env / "lib/python3.11/site-packages"
    site.mkdir(parents=True)
    import _pytest

    host_site = Path(_pytest.__file__).parent.parent
    for name in _PYTEST_PKGS:
        src = host_site / name
        if src.is_dir():
            shutil.copytree(src, site / name, ignore=shutil.ignore_patterns("__pycache__"))
        elif src.exists():
            shutil.copy2(src, site / name)
        for meta in host_site.glob(f"{name}-*.dist-info"):  # importlib.metadata reads versions
            shutil.copytree(meta, site / meta.name)
    (env / "bin/pytest").write_text(
        "#!/opt/miniconda3/envs/testbed/bin/python\n"
        "import sys\nfrom pytest import console_main\nsys.exit(console_main())\n"
    )
    (env / "bin/pytest").chmod(0o755)


def _tar(src: Path, dest: Path, prefix: str = "") -> None:
    with tarfile.open(dest, "w") as tf:
        for entry in sorted(src.iterdir()):
            tf.add(entry, arcname=prefix + entry.name)


def _wait_for(predicate: object, what: str, log: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(0.05)
    raise DockerUnavailable(f"{what} did not come up in {timeout:g} s: {log.read_text()[-2000:]}")


def _ping(sock: str) -> bool:
    try:
        with httpx.Client(transport=httpx.HTTPTransport(uds=sock), timeout=2) as c:
            return c.get("http://docker/_ping").text == "OK"
    except httpx.HTTPError:
        return False


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start_daemons(root: Path) -> dict[str, object]:
    """Start dockerd and the registry under ``root``; return what to find and stop them by."""
    for tool, pkg in (("dockerd", "docker.io"), ("docker", "docker.io"),
                      ("docker-registry", "docker-registry")):  # fmt: skip
        if shutil.which(tool) is None:
            raise DockerUnavailable(f"`{tool}` is not installed (apt-get install {pkg})")
    if os.geteuid() != 0:
        raise DockerUnavailable("dockerd needs root")
    dk = root / "dk"
    for sub in ("data", "exec"):
        (dk / sub).mkdir(parents=True, exist_ok=True)
    sock = str(dk / "docker.sock")
    log = dk / "dockerd.log"
    with open(log, "ab") as out:
        dockerd = subprocess.Popen(
            [
                "dockerd",
                "--data-root",
                str(dk / "data"),
                "--exec-root",
                str(dk / "exec"),
                "--pidfile",
                str(dk / "dockerd.pid"),
                "-H",
                f"unix://{sock}",
                "--iptables=false",
                "--ip6tables=false",
                "--bridge=none",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )

    def up() -> bool:
        if dockerd.poll() is not None:
            raise DockerUnavailable(
                f"dockerd exited ({dockerd.returncode}): {log.read_text()[-2000:]}"
            )
        return _ping(sock)

    _wait_for(up, "dockerd", log)
    reg = root / "reg"
    (reg / "data").mkdir(parents=True, exist_ok=True)
    port = _free_port()
    (reg / "config.yml").write_text(
        "version: 0.1\nlog: {level: warn, accesslog: {disabled: true}}\n"
        f"storage: {{filesystem: {{rootdirectory: {reg / 'data'}}}, delete: {{enabled: true}}}}\n"
        f"http: {{addr: 127.0.0.1:{port}}}\n"
    )
    rlog = reg / "registry.log"
    with open(rlog, "ab") as out:
        registry = subprocess.Popen(
            ["docker-registry", "serve", str(reg / "config.yml")],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )

    def reg_up() -> bool:
        if registry.poll() is not None:
            raise DockerUnavailable(f"docker-registry exited: {rlog.read_text()[-2000:]}")
        try:
            return httpx.get(f"http://127.0.0.1:{port}/v2/", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    _wait_for(reg_up, "docker-registry", rlog)
    return {"dockerd_pid": dockerd.pid, "registry_pid": registry.pid, "sock": sock, "port": port}


def _build_images(root: Path, info: dict[str, object]) -> dict[str, str]:
    """Build the test images offline and push them to the registry (about 20-40 s)."""
    sys.path.insert(0, str(Path(__file__).parent.parent))
    from tests.grading._calc import build_calc_repo

    for leftover in ("ctx", "rootfs", "envfs", "calc"):  # of a build that failed midway
        shutil.rmtree(root / leftover, ignore_errors=True)
    ctx = root / "ctx"
    ctx.mkdir()
    rootfs = root / "rootfs"
    build_rootfs(rootfs)
    _tar(rootfs, ctx / "base.tar")
    envfs = root / "envfs"
    build_env_tree(envfs)
    _tar(envfs, ctx / "env.tar")
    calc = build_calc_repo(root / "calc")
    subprocess.run(["git", "-C", str(calc.path), "config", "core.fileMode", "false"], check=True)
    _tar(calc.path, ctx / "instance.tar", prefix="testbed/")
    (ctx / "other").mkdir(exist_ok=True)
    (ctx / "other/README").write_text("instance b\n")
    with tarfile.open(ctx / "instance_b.tar", "w") as tf:
        tf.add(ctx / "other/README", arcname="testbed/README")
    (info_file := root / "calc.json").write_text(json.dumps({"base": calc.base}))
    del info_file
    reg = f"127.0.0.1:{info['port']}"
    head = (
        "FROM scratch\nADD base.tar /\n"
        "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8\n"
    )
    (ctx / "Dockerfile.base").write_text(head + 'CMD ["/bin/bash"]\n')
    swe = head + 'ADD env.tar /\n{inst}RUN ["/bin/bash", "-c", "{run}"]\nWORKDIR /testbed\n'
    (ctx / "Dockerfile.swe").write_text(swe.format(inst="ADD instance.tar /\n", run=WHITEOUT_RUN))
    (ctx / "Dockerfile.swe_b").write_text(
        head + "ADD env.tar /\nADD instance_b.tar /\nWORKDIR /testbed\n"
    )
    env = DockerEnv(root, f"unix://{info['sock']}", reg, "", "", "", calc.base)
    images = {
        "base_image": f"{reg}/trio-swe-test/base:1",
        "swe_image": f"{reg}/swebench/sweb.eval.x86_64.calc__calc-1:latest",
        "swe_image_b": f"{reg}/swebench/sweb.eval.x86_64.calc__calc-2:latest",
    }
    for key, file in (("base_image", "base"), ("swe_image", "swe"), ("swe_image_b", "swe_b")):
        env.docker("build", "-q", "--network", "none", "-f", str(ctx / f"Dockerfile.{file}"),
                   "-t", images[key], str(ctx))  # fmt: skip
        env.docker("push", "-q", images[key])
    shutil.rmtree(rootfs, ignore_errors=True)
    shutil.rmtree(envfs, ignore_errors=True)
    return images


def _stop(*pids: int) -> None:
    """SIGTERM each of ``pids``, wait up to 20 s for them all to exit, SIGKILL what is left.

    The daemons are children of the worker that started them, which may be another worker,
    alive and not reaping them: an exited one stays a zombie there, which ``kill(pid, 0)``
    still finds. So exited means gone or a zombie (the wait ran out twice over, 40 s, when
    the last worker to leave stopped the daemons another one had started).
    """
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 20
    left = list(pids)
    while left and time.monotonic() < deadline:
        for pid in left:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)  # ours: reap it
        left = [pid for pid in left if _pid_alive(pid)]
        if left:
            time.sleep(0.05)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _pid_alive(pid: int) -> bool:
    """Running: neither gone nor a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b") ", 1)[1][:1] not in (b"Z", b"X")
    except (OSError, IndexError):
        return False


def sweep_stale_roots(parent: Path = Path("/tmp")) -> None:
    """Remove the directories of earlier test runs that were killed before their teardown.

    A root is stale when no worker that used it is alive and its dockerd (if any) is gone. A
    dockerd killed before its shutdown leaves its data root bound on itself: once the daemon
    is gone, that mount is detached first. Roots in use are never touched (their lock is held
    then), and nothing is removed while anything stays mounted under a root.
    """
    for root in parent.glob("trio_swe-dk-*"):
        try:
            if time.time() - root.stat().st_mtime < 600:
                continue  # young: a run may be setting it up, before its lock is taken
        except OSError:
            continue
        users = [int(u.name.split("-")[1]) for u in root.glob("user-*") if u.name[5:].isdigit()]
        if any(_pid_alive(p) for p in users):
            continue
        try:
            state = json.loads((root / "state.json").read_text())
            if _pid_alive(int(state["dockerd_pid"])) or _pid_alive(int(state["registry_pid"])):
                continue
        except (OSError, ValueError, KeyError):
            pass
        try:
            with open(root / "lock", "a") as f:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                # Deepest first; --lazy: a mount still busy goes once its last user does.
                for mount in sorted(_mounts_under(root), key=len, reverse=True):
                    subprocess.run(["umount", "--lazy", mount], capture_output=True, check=False)
                if not _mounts_under(root):
                    shutil.rmtree(root, ignore_errors=True)
        except OSError:
            continue  # locked: someone is starting it right now


def _mounts_under(root: Path) -> list[str]:
    """Mount points at or under ``root`` (``/proc/self/mountinfo``'s octal escapes decoded)."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), line.split()[4])
        if point == str(root) or point.startswith(f"{root}/"):
            found.append(point)
    return found


def _shared_root() -> Path:
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID") or f"p{os.getpid()}"
    return Path("/tmp") / f"trio_swe-dk-{run[:12]}"


@contextlib.contextmanager
def _locked(root: Path) -> Iterator[None]:
    root.mkdir(parents=True, exist_ok=True)
    with open(root / "lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@contextlib.contextmanager
def docker_env() -> Iterator[DockerEnv]:
    """The shared daemon, registry and images, for as long as this worker needs them."""
    root = _shared_root()
    with contextlib.suppress(OSError):
        sweep_stale_roots()
    me = root / f"user-{os.getpid()}"
    with _locked(root):
        state = root / "state.json"
        info: dict[str, object] | None = None
        if state.exists():
            info = json.loads(state.read_text())
            if not _ping(str(info["sock"])):
                info = None
        if info is None:
            try:
                info = _start_daemons(root)
                info.update(_build_images(root, info))
            except BaseException:
                for pid_file in (root / "dk/dockerd.pid",):
                    if pid_file.exists():
                        _stop(int(pid_file.read_text()))
                if info is not None and "registry_pid" in info:
                    _stop(int(info["registry_pid"]))  # type: ignore[call-overload]
                raise
            state.write_text(json.dumps(info))
        me.touch()
    calc = json.loads((root / "calc.json").read_text())
    try:
        yield DockerEnv(
            root=root,
            docker_host=f"unix://{info['sock']}",
            registry=f"127.0.0.1:{info['port']}",
            base_image=str(info["base_image"]),
            swe_image=str(info["swe_image"]),
            swe_image_b=str(info["swe_image_b"]),
            calc_base=calc["base"],
        )
    finally:
        with _locked(root):
            me.unlink(missing_ok=True)
            if not list(root.glob("user-*")):
                _stop(int(info["dockerd_pid"]), int(info["registry_pid"]))  # type: ignore[call-overload]
                (root / "state.json").unlink(missing_ok=True)
                shutil.rmtree(root / "dk", ignore_errors=True)
                shutil.rmtree(root / "reg", ignore_errors=True)
                shutil.rmtree(root / "ctx", ignore_errors=True)
                shutil.rmtree(root / "calc", ignore_errors=True)
                shutil.rmtree(root / "oci-cache", ignore_errors=True)
                (root / "calc.json").unlink(missing_ok=True)


def session_env() -> Iterator[DockerEnv]:
    """The body of the session fixture: skip with the reason, or fail under ``CI=true``."""
    global ACTIVE
    import pytest

    cm = docker_env()
    try:
        env = cm.__enter__()
    except (DockerUnavailable, RuntimeError, OSError, subprocess.SubprocessError) as exc:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"CI: the test Docker daemon and registry must start here: {exc}")
        pytest.skip(f"no test Docker daemon: {exc}")
    ACTIVE = env
    try:
        yield env
    finally:
        ACTIVE = None
        cm.__exit__(None, None, None)

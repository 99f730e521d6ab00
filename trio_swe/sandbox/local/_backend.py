"""``LocalBackend``: sandboxes on this machine, isolated with bubblewrap, copy-on-write."""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import posixpath
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final, Literal

import trio

from ..._errors import (
    BackendUnavailableError,
    InvalidArgumentError,
    PermanentBootError,
    SandboxBootError,
)
from .._images import ImageMap, ImageSource
from .._types import BackendStatistics, SandboxSpec
from .._validate import check_abs_path, check_user
from ..oci import OciImage, OciStore, OciStoreStatistics, is_oci_image
from ..oci._manifest import env_mapping
from ..oci._unpack import read_file_in
from ._image import ImageCache, check_local_image, commit_mismatch
from ._rootfs import HostRootCache, PathState, lstat_state, mount_args, workdir_problem
from ._sandbox import LocalSandbox, kill_namespace, kill_process_group
from ._trash import Trash, owner_gone
from ._users import AGENT, ROOT, SandboxUser, group_with, passwd_with, pick_users

WorkspaceMode = Literal["auto", "overlay", "copy"]

_REQUIRED_TOOLS = {
    "bwrap": "bubblewrap",
    "nsenter": "util-linux",
    "unshare": "util-linux",
    "setpriv": "util-linux",
}

# Mounts the overlay in the private mount namespace made by `unshare`, then runs bwrap. Paths
# (and the extra options, ours) arrive as positional arguments, never spliced into the script.
# The shell stays bwrap's parent (no `exec`): see _PARENT.
_OVERLAY_THEN_RUN = (
    'mount -t overlay -o "lowerdir=$1,upperdir=$2,workdir=$3$4" overlay "$5" && shift 5 && "$@"'
)
# The process a boot starts is a shell that runs bwrap as its child, never bwrap itself. A
# supervisor that kills a dead worker's direct children (Ray does, by default) would otherwise
# kill bwrap in the middle of its setup, after it has cloned the namespace's first process and
# before it lets it run: that process then waits for bwrap's go-ahead forever, holding its
# namespaces and mounts. With the shell killed instead, bwrap finishes the boot, and the sandbox
# ends through its lifeline (the init's stdin, whose writer was the dead worker).
_PARENT: Final = ("sh", "-c", '"$@"', "bwrap-parent")
#: The overlay's extra mount option where the kernel has it (Linux 5.10+). Without it, every
#: unmount of an overlay (each sandbox's kill: its mount namespace is torn down) runs
#: ``sync_filesystem`` on the *upper layer's whole file system* (the host's disk under the
#: state directory), so each kill waits for a sync of everything dirty there. A sandbox's
#: upper layer is thrown away at its kill, so nothing in it needs to reach the disk; the price
#: is that ``fsync`` inside the sandbox does not sync either (nothing outlives the sandbox).
OVERLAY_VOLATILE: Final = ",volatile"


def _overlay_argv(
    lower: str | Path,
    upper: str | Path,
    work: str | Path,
    merged: str | Path,
    argv: Sequence[str],
    *,
    options: str = "",
) -> list[str]:
    """``argv`` run in a private mount namespace (``unshare``) once overlayfs is mounted at
    ``merged`` (``lower``: one directory, or several joined by ``:``, top first; ``options``:
    more mount options, each led by a comma, e.g. :data:`OVERLAY_VOLATILE`). The probe and
    both boots (a directory tree, an OCI image) start their overlay this one way."""
    if options and not options.startswith(","):
        raise ValueError(f"overlay options must start with ',': {options!r}")
    unshare = ["unshare", "--mount", "--propagation", "private", "--"]
    paths = [str(p) for p in (lower, upper, work)]
    return [
        *unshare,
        "sh",
        "-c",
        _OVERLAY_THEN_RUN,
        "overlay",
        *paths,
        options,
        str(merged),
        *argv,
    ]


# Host directories every sandbox gets a private, writable copy of (empty at boot): the host's
# /tmp and root's home are neither shown nor written. Host paths under them that commands need
# (the running interpreter, ``extra_path``, ``host_paths``) are bound back read-only.
_PRIVATE_DIRS = ("/tmp", ROOT.home)


def _under(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent.rstrip("/") + "/")


def venv_root(bin_dir: str) -> str | None:
    """The root of the virtualenv whose ``bin`` is ``bin_dir`` (it has ``pyvenv.cfg``), or None.

    A venv is its whole root: ``python`` finds ``pyvenv.cfg`` beside its ``bin`` and its packages
    in ``lib/``. Without them it runs as the bare base interpreter.
    """
    root = os.path.dirname(os.path.abspath(bin_dir))
    return root if os.path.isfile(os.path.join(root, "pyvenv.cfg")) else None


def _venv_base(bin_dir: str) -> str | None:
    """The base interpreter's prefix of the virtualenv whose ``bin`` is ``bin_dir``, if it is one.

    A venv's ``python`` is a symlink into its base installation (e.g. pyenv's under /root), so
    showing the venv alone would leave that link dangling in the sandbox.
    """
    try:
        cfg = Path(bin_dir).parent.joinpath("pyvenv.cfg").read_text()
    except OSError:
        return None
    for line in cfg.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() == "home" and value.strip():
            return os.path.dirname(os.path.abspath(value.strip()))
    return None


def _outermost(paths: set[str]) -> list[str]:
    """``paths`` without those inside another one (one mount shows both)."""
    return sorted(p for p in paths if not any(q != p and _under(p, q) for q in paths))


def _default_state_root() -> Path:
    return Path(tempfile.gettempdir()) / f"trio_swe-{os.getuid()}"


class LocalBackendStatistics(BackendStatistics, frozen=True, kw_only=True):
    """The local backend's counters.

    Attributes:
        workspace_mode: ``"overlay"``, ``"copy"``, or ``"unknown"`` before the first boot of a
            backend in ``"auto"`` mode.
        oci: the OCI image cache's counters.
        removals_pending: killed sandboxes whose state directory is still being removed in
            the background (``aclose`` waits for them).
    """

    workspace_mode: str
    oci: OciStoreStatistics
    removals_pending: int = 0


class LocalBackend(trio.abc.AsyncResource):
    """Sandboxes on this machine: bubblewrap, own PID/mount/IPC/UTS namespaces.

    The host's root file system is visible read-only, except ``/tmp`` and root's home
    ``/root``: each sandbox has its own, writable and empty at boot (``/tmp`` a tmpfs, ``/root``
    a directory in the sandbox's state), removed when it is killed. Each unprivileged user
    (``agent``, see ``users``) has its own writable ``/home/<name>`` likewise. ``HOME`` is the
    running user's home.

    Args:
        state_dir: where per-sandbox state and cached git checkouts live (default
            ``$TMPDIR/trio_swe-<uid>``).
        workspace: ``"overlay"`` (kernel overlayfs in a private mount namespace; boot does not
            copy the tree; mounted ``volatile`` where the kernel has it, so a kill's unmount
            does not sync the host's disk, and ``fsync`` in the sandbox does not reach the
            disk either: nothing of the upper layer outlives the sandbox), ``"copy"`` (a full
            copy per sandbox), or ``"auto"`` (overlay where the kernel allows it, else copy;
            ``statistics().workspace_mode`` says which).
        ro_binds: extra read-only mounts, sandbox path -> host path (e.g. shims at
            ``/opt/miniconda3/bin/activate``).
        extra_path: host directories put first on every command's ``PATH`` (e.g. a venv's bin).
        host_paths: host paths to show (read-only) at the same place even where the sandbox
            has its own directory (under ``/tmp`` or ``/root``, e.g. ``/root/.cargo``); entries
            of ``extra_path`` (for a virtualenv's ``bin``: the whole virtualenv, with its
            ``pyvenv.cfg`` and ``lib/``), the base interpreters of virtualenvs among them, and
            the running interpreter (``sys.prefix``, ``sys.base_prefix``) are shown this way
            too. Each costs one mount per boot. ``"/root"`` itself shows the host's ``/root`` instead of a
            private one (read-only).
        env: environment of every command in every sandbox of this backend.
        max_concurrent_boots: boots in flight at once; more wait their turn. The kernel
            serializes mount operations, so a thundering herd of boots is slower than a queue
            and can push single boots past ``boot_timeout_sec``.
        boot_timeout_sec: how long one boot may take once started before it fails with
            :class:`SandboxBootError`.
        images: which local image each row boots (the image-mapping hook ``image_for``):
            instance id -> image, or a function of the instance metadata returning one (None:
            the row's own image). E.g. ``trio_swe.grading.local_checkouts("/src")`` boots
            SWE-bench rows from ``/src/<owner>__<name>@<base_commit>``.
        oci_cache_dir: the cache of unpacked OCI image layers, shared by every sandbox and
            backend that names it (default ``<state_dir>/oci``).
        plain_http_registries: registries (``host:port``) pulled over plain HTTP; loopback
            ones always are.
        users: the unprivileged accounts every sandbox has besides ``root`` (default
            ``("agent",)``), each with uid and gid >= 1000 (or the host's or image's own, when
            it has the name) and a private writable home ``/home/<name>``. E2B's templates run
            as ``user``: the envd test server's sandboxes have ``("user", "agent")``.

    Images: a directory or ``path@commit`` is shown at the workdir over the host's root; an
    OCI image (``registry/name:tag``, ``name@sha256:...``, ``oci:DIR[:TAG]``,
    ``docker-archive:FILE``) is pulled without a daemon, unpacked once into the layer cache and
    becomes the sandbox's whole root, copy-on-write (it needs overlayfs).

    Raises:
        BackendUnavailableError: on first use, if bubblewrap or util-linux is missing.
    """

    name = "local"

    def __init__(
        self,
        *,
        state_dir: str | os.PathLike[str] | None = None,
        workspace: WorkspaceMode = "auto",
        ro_binds: Mapping[str, str] | None = None,
        extra_path: Sequence[str] = (),
        host_paths: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        max_concurrent_boots: int = 8,
        boot_timeout_sec: float = 60.0,
        images: ImageSource | None = None,
        oci_cache_dir: str | os.PathLike[str] | None = None,
        plain_http_registries: Sequence[str] = (),
        users: Sequence[str] = (AGENT,),
    ) -> None:
        self.image_for = ImageMap(images)
        if isinstance(users, str):
            raise InvalidArgumentError(f"users must be a sequence of names, got {users!r}")
        self._user_names = tuple(check_user(u) for u in users)
        if ROOT.name in self._user_names or len(set(self._user_names)) != len(self._user_names):
            raise InvalidArgumentError(f"users must be distinct and not root: {users!r}")
        self._boot_limiter = trio.CapacityLimiter(max_concurrent_boots)
        self._boot_timeout = boot_timeout_sec
        # Absolute: mount options and bind sources must not depend on the working directory
        # (a relative overlay lowerdir fails as "special device overlay does not exist").
        self._root = (
            Path(os.path.abspath(state_dir)) if state_dir is not None else _default_state_root()
        )
        self._workspace: WorkspaceMode = workspace
        self._ro_binds = {
            check_abs_path(k, what="ro_binds target"): str(v) for k, v in (ro_binds or {}).items()
        }
        self._extra_path = [os.path.abspath(p) for p in extra_path]
        shown = {*self._extra_path, *(os.path.abspath(p) for p in host_paths)}
        shown |= {sys.prefix, sys.base_prefix}
        shown |= {base for d in self._extra_path if (base := _venv_base(d)) is not None}
        # A venv's bin alone would run as the bare base interpreter: show the venv whole.
        shown |= {root for d in self._extra_path if (root := venv_root(d)) is not None}
        # Only paths under a private directory need a mount; the rest of the host root is
        # visible already. Each costs one mount per boot, so nested ones are shown once.
        self._host_binds = _outermost(
            {p for p in shown if any(_under(p, d) for d in _PRIVATE_DIRS) and os.path.exists(p)}
        )
        self._env = dict(env or {})
        self._images = ImageCache(self._root / "images")
        self._trash = Trash(self._root)
        self._oci = OciStore(
            Path(oci_cache_dir) if oci_cache_dir is not None else self._root / "oci",
            plain_http=plain_http_registries,
        )
        self._overlay_ok: bool | None = None
        # The host root's plan and passwd/group, reused while the host's files are unchanged.
        self._host_root = HostRootCache()
        self._users: (
            tuple[tuple[PathState, PathState], tuple[tuple[SandboxUser, ...], str, str]] | None
        ) = None
        self._shared: set[Path] = set()  # files of _shared_file written by this backend
        self._overlay_options = ""  # OVERLAY_VOLATILE once the probe found the kernel has it
        self._counter = itertools.count()
        self._live: set[LocalSandbox] = set()
        self._stats: dict[str, Any] = {"created": 0, "killed": 0, "boot_failures": 0}
        self._checked = False

    async def aclose(self) -> None:
        """Wait for the removal of killed sandboxes' state directories (they run in the
        background, see :meth:`LocalSandbox.kill`). A local backend holds no connections, and
        its sandboxes are killed by :func:`~trio_swe.open_sandbox`."""
        await self._trash.wait()

    def check_image(self, image: str, *, commit: str | None = None) -> str | None:
        """Why ``image`` cannot boot here, or None: a directory, or ``path@commit`` of a git
        repository that has the commit; with ``commit`` (the row's ``base_commit``), the
        image's checkout must be that commit. Runs ``git rev-parse`` (milliseconds). An OCI
        image reference passes: its commit is only known once it is pulled."""
        if is_oci_image(image):
            return None
        hit = self._images.cached(image)
        if hit is not None:  # built from exactly that commit: no git call needed
            return commit_mismatch(image, hit[1], commit)
        return check_local_image(image, commit)

    def statistics(self) -> LocalBackendStatistics:
        mode = {True: "overlay", False: "copy", None: "unknown"}[self._overlay_ok]
        if self._workspace == "copy":
            mode = "copy"
        return LocalBackendStatistics(
            **self._stats,
            live=len(self._live),
            workspace_mode=mode,
            oci=self._oci.statistics(),
            removals_pending=self._trash.pending,
        )

    # -- checks -------------------------------------------------------------------------------
    def _check_tools(self) -> None:
        if self._checked:
            return
        for tool, package in _REQUIRED_TOOLS.items():
            if shutil.which(tool) is None:
                raise BackendUnavailableError(
                    f"the local backend needs `{tool}`; install the Debian/Ubuntu package "
                    f"'{package}' (apt-get install {package})"
                )
        self._checked = True

    async def _probe_overlay(self) -> bool:
        """Can this process mount overlayfs in a private mount namespace, and with
        :data:`OVERLAY_VOLATILE`? Asked once."""
        if self._overlay_ok is not None:
            return self._overlay_ok
        for options in (OVERLAY_VOLATILE, ""):
            if await self._try_overlay(options):
                self._overlay_ok, self._overlay_options = True, options
                return True
        self._overlay_ok = False
        return False

    async def _try_overlay(self, options: str) -> bool:
        probe = Path(tempfile.mkdtemp(prefix="probe-", dir=self._root))
        try:
            for sub in ("lower", "upper", "work", "merged"):
                (probe / sub).mkdir()
            result = await trio.run_process(
                _overlay_argv(
                    probe / "lower",
                    probe / "upper",
                    probe / "work",
                    probe / "merged",
                    ["true"],
                    options=options,
                ),
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )
            return result.returncode == 0
        finally:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(shutil.rmtree, probe, True)

    def _sweep_stale(self) -> None:
        """Remove state left by processes that died without cleaning up (e.g. SIGKILLed)."""
        for entry in self._root.glob("sb-*"):
            if owner_gone(entry.name):
                shutil.rmtree(entry, ignore_errors=True)
        self._trash.sweep()

    # -- boot -------------------------------------------------------------------------------
    async def create_sandbox(self, spec: SandboxSpec, nursery: trio.Nursery) -> LocalSandbox:
        """Boot a sandbox; see :func:`trio_swe.open_sandbox`."""
        oci: OciImage | None = None
        if is_oci_image(spec.image):
            # Pulled (or found in the shared cache) before taking a boot slot: a pull can be long.
            try:
                oci = await self._oci.get(spec.image)
            except BaseException:
                self._stats["boot_failures"] += 1
                raise
        async with self._boot_limiter:
            return await self._boot(spec, nursery, oci)

    async def _boot(
        self, spec: SandboxSpec, nursery: trio.Nursery, oci: OciImage | None = None
    ) -> LocalSandbox:
        self._check_tools()
        workdir = check_abs_path(spec.workdir, what="workdir")
        problem = workdir_problem(posixpath.normpath(workdir))
        if problem is not None:
            raise PermanentBootError(problem)
        t0 = time.monotonic()
        self._root.mkdir(parents=True, exist_ok=True)
        if self._stats["created"] == 0 and self._stats["boot_failures"] == 0:
            await trio.to_thread.run_sync(self._sweep_stale)
        lower = None
        if oci is None:
            lower = await self._images.resolve(spec.image)
            if not lower.is_dir():
                raise PermanentBootError(f"local image {spec.image!r}: {lower} is not a directory")
        use_overlay = self._workspace != "copy" and await self._probe_overlay()
        if self._workspace == "overlay" and not use_overlay:
            raise SandboxBootError("workspace='overlay' but overlayfs cannot be mounted here")
        if oci is not None and not use_overlay:
            raise SandboxBootError(
                f"OCI image {spec.image!r}: booting an image root needs overlayfs "
                f"(workspace={self._workspace!r}; overlay mountable: {self._overlay_ok})"
            )

        sid = f"sb-{os.getpid()}-{next(self._counter)}-{os.urandom(3).hex()}"
        state = self._root / sid
        bwrap: trio.Process | None = None
        try:
            state.mkdir()
            if oci is not None:
                argv, users, base_env = await trio.to_thread.run_sync(
                    self._prepare_oci, state, oci, workdir, spec
                )
            elif use_overlay:
                # A few mkdirs (the plan and passwd/group are cached): cheaper
                # here than a thread hop there and back.
                assert lower is not None
                argv, users, base_env = self._prepare(state, lower, workdir, spec, True)
            else:  # copies the whole tree
                assert lower is not None
                argv, users, base_env = await trio.to_thread.run_sync(
                    self._prepare, state, lower, workdir, spec, False
                )
            # bwrap writes the init's pid to a memory file, not a pipe: a write to a pipe whose
            # reader died (a killed worker) would kill bwrap before it lets the init run.
            info_w = os.memfd_create("trio-swe-bwrap-info", os.MFD_CLOEXEC)
            info_r = os.dup(info_w)
            argv = [str(info_w) if a == "{INFO_FD}" else a for a in argv]
            try:
                bwrap = await trio.lowlevel.open_process(
                    argv,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    pass_fds=(info_w,),
                    env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
                    # bwrap and its namespace init share this new process group, so one killpg
                    # reaches the init even before we have learnt its pid.
                    start_new_session=True,
                )
            finally:
                os.close(info_w)
            mounted = (
                f" (overlay mount of image {spec.image!r}: lowerdir={lower}, "
                f"upperdir={state / 'upper'}, workdir={state / 'work'}, on {state / 'merged'})"
                if use_overlay
                else ""
            )
            init_pid = await _read_child_pid(info_r, bwrap, self._boot_timeout, mounted)
            sandbox = LocalSandbox(
                sandbox_id=sid,
                workdir=workdir,
                nursery=nursery,
                bwrap=bwrap,
                init_pid=init_pid,
                state_dir=state,
                users=users,
                base_env=base_env,
                network=spec.network,
                workspace_mode="overlay" if use_overlay else "copy",
                image_root=oci is not None,
                boot_sec=time.monotonic() - t0,
                on_close=self._closed,
                trash=self._trash,
            )
        except BaseException:
            self._stats["boot_failures"] += 1
            with trio.CancelScope(shield=True):
                if bwrap is not None:
                    await kill_namespace(None, bwrap, what=f"failed boot {sid}")
                await trio.to_thread.run_sync(shutil.rmtree, state, True)
            raise
        self._stats["created"] += 1
        self._live.add(sandbox)
        return sandbox

    def _closed(self, sandbox: LocalSandbox) -> None:
        if sandbox in self._live:
            self._live.discard(sandbox)
            self._stats["killed"] += 1

    def _host_users(self) -> tuple[tuple[SandboxUser, ...], str, str]:
        """The unprivileged users and the sandbox's passwd and group texts, from the host's
        files (read again only when their ``lstat`` changed)."""
        t0 = time.time_ns()
        seen = (lstat_state("/etc/passwd"), lstat_state("/etc/group"))
        if self._users is not None and self._users[0] == seen:
            return self._users[1]
        host_passwd = Path("/etc/passwd").read_text()
        accounts = pick_users(host_passwd, self._user_names)
        users = (
            accounts,
            passwd_with(host_passwd, *accounts),
            group_with(Path("/etc/group").read_text(), *accounts),
        )
        # Kept once settled (see HostRootCache): an edit in the same mtime tick as this read
        # would otherwise go unseen.
        settled = all(st is None or st[3] < t0 - 1_000_000_000 for st in seen)
        self._users = (seen, users) if settled else None
        return users

    def _shared_file(self, name: str, text: str) -> str:
        """A read-only file with ``text``, shared by the sandboxes that bind it (named by its
        content under ``<state root>/shared``; written once, atomically): a file created per
        boot costs a few hundred microseconds on a journaling file system."""
        data = text.encode()
        path = self._root / "shared" / f"{name}-{hashlib.sha256(data).hexdigest()[:16]}"
        if path not in self._shared or not path.is_file():
            path.parent.mkdir(exist_ok=True)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(3).hex()}")
            tmp.write_bytes(data)
            os.replace(tmp, path)
            self._shared.add(path)
        return str(path)

    def _prepare(
        self, state: Path, lower: Path, workdir: str, spec: SandboxSpec, use_overlay: bool
    ) -> tuple[list[str], dict[str, Any], dict[str, str]]:
        """Lay out the sandbox's state directory and build the host command that boots it."""
        accounts, passwd, group = self._host_users()
        passwd_file = self._shared_file("passwd", passwd)
        group_file = self._shared_file("group", group)
        homes = _make_homes(state, accounts)
        # root's own HOME, replacing the host's /root (which the sandbox never sees): tools
        # write ~/.cache, ~/.config, `git config --global`, `pip install --user` there.
        root_home = state / "home-root"
        root_home.mkdir(mode=0o700)

        if use_overlay:
            for sub in ("upper", "work", "merged"):
                (state / sub).mkdir()
            # A symlink keeps odd characters of the image path (',', ':') out of mount options.
            (state / "lower").symlink_to(lower)
            workspace = state / "merged"
        else:
            workspace = state / "ws"
            subprocess.run(
                ["cp", "-a", "--reflink=auto", f"{lower}/.", str(workspace)],
                check=True,
                capture_output=True,
            )

        mounts: dict[str, tuple[str, str]] = {
            "/etc/passwd": ("ro-bind", passwd_file),
            "/etc/group": ("ro-bind", group_file),
            ROOT.home: ("bind", str(root_home)),
            **{u.home: ("bind", str(h)) for u, h in zip(accounts, homes, strict=True)},
            workdir: ("bind", str(workspace)),
        }
        for path in self._host_binds:
            # Asked for by name, the host's /root itself replaces the private one (read-only).
            if path == ROOT.home or path not in mounts:
                mounts[path] = ("ro-bind", path)
        for target, host in self._ro_binds.items():
            mounts[target] = ("ro-bind", host)
        bwrap = ["bwrap", *self._host_root.host_args(mounts), *mount_args(mounts)]
        bwrap += ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--hostname", "sandbox"]
        if not spec.network:
            bwrap.append("--unshare-net")
        bwrap += ["--info-fd", "{INFO_FD}", "--chdir", workdir]
        # The init says "ready" once the namespaces are fully set up (bwrap's --info-fd is
        # written before the mounts are), then waits on its stdin: a pipe whose only writer is
        # this Python process. If we die, even by SIGKILL, the pipe closes and the init kills
        # every process in the namespace (CAP_KILL, since bwrap drops root's capabilities), after
        # which bwrap's reaper exits and the namespace is gone. (bwrap's --die-with-parent
        # cannot do this: trio forks from a worker thread, and the parent-death signal fires
        # when that *thread* exits.)
        bwrap += ["--cap-add", "CAP_KILL"]
        bwrap += ["/bin/sh", "-c", "echo ready; cat >/dev/null; kill -KILL -1"]

        path = ":".join([*self._extra_path, os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin")])
        base_env = {
            "PATH": path,
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            # The image is owned by the host's root; let `agent` run git in it anyway.
            "GIT_CONFIG_COUNT": "1",
            "GIT_CONFIG_KEY_0": "safe.directory",
            "GIT_CONFIG_VALUE_0": "*",
            "PIP_DISABLE_PIP_VERSION_CHECK": "1",
            "PYTHONDONTWRITEBYTECODE": "1",
            **self._env,
            **dict(spec.env),
        }
        if use_overlay:
            argv = _overlay_argv(
                state / "lower",
                state / "upper",
                state / "work",
                state / "merged",
                bwrap,
                options=self._overlay_options,
            )
        else:
            argv = [*_PARENT, *bwrap]
        return argv, {"root": ROOT, **{u.name: u for u in accounts}}, base_env

    def _prepare_oci(
        self, state: Path, oci: OciImage, workdir: str, spec: SandboxSpec
    ) -> tuple[list[str], dict[str, Any], dict[str, str]]:
        """Lay out a sandbox whose root is an OCI image: its layers overlaid, copy-on-write.

        The image is the whole root (the host's is not shown): the layers are the overlay's
        lower directories, shared read-only by every sandbox, and the sandbox writes into an
        upper directory of its own. ``ro_binds`` still bind host paths into it.
        """
        top_first = list(reversed(oci.layers))
        image_passwd = read_file_in(top_first, "etc/passwd") or "root:x:0:0:root:/root:/bin/sh\n"
        image_group = read_file_in(top_first, "etc/group") or "root:x:0:\n"
        accounts = pick_users(image_passwd, self._user_names)
        (state / "passwd").write_text(passwd_with(image_passwd, *accounts))
        (state / "group").write_text(group_with(image_group, *accounts))
        homes = _make_homes(state, accounts)
        for sub in ("upper", "work", "merged", "l"):
            (state / sub).mkdir()
        # Short names keep the mount options under a page whatever the cache's path.
        names = []
        for i, layer in enumerate(top_first):
            (state / "l" / str(i)).symlink_to(layer)
            names.append(str(state / "l" / str(i)))
        if len(names) == 1:  # overlayfs wants two lower layers, or an upper one
            (state / "l" / "empty").mkdir()
            names.append(str(state / "l" / "empty"))
        rel = workdir.lstrip("/")
        if not any(os.path.lexists(layer / rel) for layer in top_first):
            (state / "upper" / rel).mkdir(parents=True)
        merged = str(state / "merged")
        bwrap = ["bwrap", "--bind", merged, "/", "--dev", "/dev", "--proc", "/proc"]
        bwrap += ["--perms", "1777", "--tmpfs", "/tmp"]
        bwrap += ["--ro-bind", str(state / "passwd"), "/etc/passwd"]
        bwrap += ["--ro-bind", str(state / "group"), "/etc/group"]
        for u, h in zip(accounts, homes, strict=True):
            bwrap += ["--bind", str(h), u.home]
        for target, host in self._ro_binds.items():
            bwrap += ["--ro-bind", host, target]
        bwrap += ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--hostname", "sandbox"]
        if not spec.network:
            bwrap.append("--unshare-net")
        bwrap += ["--info-fd", "{INFO_FD}", "--chdir", workdir, "--cap-add", "CAP_KILL"]
        bwrap += ["/bin/sh", "-c", "echo ready; cat >/dev/null; kill -KILL -1"]
        env = env_mapping(oci.config.env)
        base_env = {
            "PATH": env.pop("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"),
            **env,
            "GIT_CONFIG_COUNT": "1",
            "GIT_CONFIG_KEY_0": "safe.directory",
            "GIT_CONFIG_VALUE_0": "*",
            "PIP_DISABLE_PIP_VERSION_CHECK": "1",
            "PYTHONDONTWRITEBYTECODE": "1",
            **self._env,
            **dict(spec.env),
        }
        argv = _overlay_argv(
            ":".join(names),
            state / "upper",
            state / "work",
            merged,
            bwrap,
            options=self._overlay_options,
        )
        return argv, {"root": ROOT, **{u.name: u for u in accounts}}, base_env


def _make_homes(state: Path, accounts: Sequence[SandboxUser]) -> list[Path]:
    """Each account's private home in the sandbox's state, owned by it."""
    homes = []
    for u in accounts:
        home = state / f"home-{u.name}"
        home.mkdir()
        os.chown(home, u.uid, u.gid)
        homes.append(home)
    return homes


async def _read_child_pid(
    fd: int, bwrap: trio.Process, timeout_sec: float, mounted: str = ""
) -> int:
    """Wait for the init's ``ready`` line, then read bwrap's ``--info-fd`` JSON ({"child-pid":
    N}) from the memory file ``fd`` (bwrap writes it before the init starts; closed here);
    fail with bwrap's stderr if it died.

    ``mounted`` describes the overlay mount made before bwrap, named when that mount failed.
    """
    deadline = trio.current_time() + timeout_sec
    ready = b""
    try:
        if bwrap.stdout is not None:
            with trio.move_on_at(deadline):
                while b"\n" not in ready:
                    line = await bwrap.stdout.receive_some(64)
                    if not line:
                        break
                    ready += bytes(line)
            await bwrap.stdout.aclose()
        data = os.pread(fd, 4096, 0)
    finally:
        os.close(fd)
    try:
        if ready != b"ready\n":
            raise ValueError("sandbox init did not report ready")
        return int(json.loads(data)["child-pid"])
    except (ValueError, KeyError, TypeError):
        err = b""
        if bwrap.stderr is not None:
            with trio.move_on_after(2):
                if bwrap.returncode is None:
                    kill_process_group(bwrap.pid)  # the shell, bwrap, and what bwrap started
                while piece := await bwrap.stderr.receive_some(65536):
                    err += bytes(piece)
        if trio.current_time() >= deadline:
            raise SandboxBootError(f"the sandbox was not ready within {timeout_sec:g} s") from None
        text = err.decode(errors="replace").strip() or "no output"
        if mounted and text.startswith("mount:"):
            raise SandboxBootError(f"the workspace could not be mounted: {text}{mounted}") from None
        raise SandboxBootError(f"bubblewrap failed to start the sandbox: {text}") from None

"""OCI images on the local backend: sans-IO cores on data, unpacking on crafted layers, then a
real registry on loopback (tests/dockerenv.py) whose images the daemon built and pushed."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import shutil
import stat
import subprocess
import sys
import tarfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from trio_swe import LocalBackend, exec_and_wait, open_sandbox
from trio_swe.grading import get_metadata, run_evaluation
from trio_swe.sandbox.oci import ImageError, OciStore, is_oci_image, parse_reference
from trio_swe.sandbox.oci._manifest import (
    DOCKER_MANIFEST,
    OCI_INDEX,
    Index,
    Manifest,
    check_digest,
    parse_manifest,
    select_platform,
)
from trio_swe.sandbox.oci._plan import Action, check_no_symlink_parent, clean_path, plan_entry
from trio_swe.sandbox.oci._store import chain_ids
from trio_swe.sandbox.oci._unpack import unpack_layer

from ..dockerenv import DockerEnv
from ..grading._calc import build_calc_repo

D1 = "sha256:" + "1" * 64
D2 = "sha256:" + "2" * 64

# -- sans-IO -----------------------------------------------------------------------------------


def test_references() -> None:
    r = parse_reference("127.0.0.1:5000/swebench/sweb.eval.x86_64.a_1776_b-1:latest")
    assert (r.registry, r.repository, r.tag) == (
        "127.0.0.1:5000",
        "swebench/sweb.eval.x86_64.a_1776_b-1",
        "latest",
    )
    assert parse_reference("ubuntu").repository == "library/ubuntu"
    assert parse_reference("ubuntu").registry == "docker.io"
    pinned = parse_reference(f"ghcr.io/a/b@{D1}")
    assert (pinned.ref, pinned.tag) == (D1, None)
    for bad in ("UPPER/case", "a/b:", "a@sha256:xyz", "a/../b"):
        with pytest.raises(ImageError):
            parse_reference(bad)


def test_image_kinds(tmp_path: Path) -> None:
    assert is_oci_image("127.0.0.1:5000/a:1")
    assert is_oci_image("swebench/sweb.eval.x86_64.django_1776_django-11099")
    assert is_oci_image("oci:/some/layout:tag")
    assert is_oci_image("docker-archive:/x.tar")
    assert not is_oci_image(str(tmp_path))  # a directory
    assert not is_oci_image("/repo@abc123")  # path@commit
    assert not is_oci_image("./rel/dir")


def _index(*platforms: tuple[str, str], media: str = DOCKER_MANIFEST) -> bytes:
    return json.dumps(
        {
            "mediaType": OCI_INDEX,
            "manifests": [
                {
                    "mediaType": media,
                    "digest": f"sha256:{i:064d}",
                    "size": 1,
                    "platform": {"os": o, "architecture": a},
                }
                for i, (o, a) in enumerate(platforms)
            ],
        }
    ).encode()


def test_manifest_selection() -> None:
    index = parse_manifest(
        _index(("unknown", "unknown"), ("linux", "arm64"), ("linux", "amd64")), None, "t"
    )
    assert isinstance(index, Index)
    assert select_platform(index).digest == f"sha256:{2:064d}"
    with pytest.raises(ImageError, match="linux/arm64"):
        select_platform(parse_manifest(_index(("linux", "arm64")), OCI_INDEX, "t"))  # type: ignore[arg-type]
    body = json.dumps(
        {
            "schemaVersion": 2,
            "config": {"digest": D1, "size": 2},
            "layers": [{"digest": D2, "size": 3}],
        }
    ).encode()
    m = parse_manifest(body, DOCKER_MANIFEST + "; charset=utf-8", "t")
    assert isinstance(m, Manifest)
    assert [x.digest for x in m.layers] == [D2]
    assert isinstance(parse_manifest(body, None, "t"), Manifest)  # OCI without mediaType
    with pytest.raises(ImageError, match="schema 1"):
        parse_manifest(
            b'{"schemaVersion": 1}',
            "application/vnd.docker.distribution.manifest.v1+prettyjws",
            "t",
        )
    check_digest(b"x", "sha256:" + hashlib.sha256(b"x").hexdigest(), "t")
    with pytest.raises(ImageError, match="digest mismatch"):
        check_digest(b"y", "sha256:" + hashlib.sha256(b"x").hexdigest(), "t")


def test_whiteout_plan_and_path_safety() -> None:
    assert plan_entry("usr/bin/.wh.date") == Action("whiteout", "usr/bin/date")
    assert plan_entry("./usr/share/t/.wh..wh..opq") == Action("opaque", "usr/share/t")
    assert plan_entry("/etc/passwd") == Action("create", "etc/passwd")  # absolute: inside the root
    assert plan_entry("a/./b/../c") == Action("create", "a/c")
    assert plan_entry("./") is None
    for bad in ("../x", "a/../../x", "a/.wh.", "x\x00y"):
        with pytest.raises(ImageError):
            plan_entry(bad)
    assert clean_path("./a//b/") == "a/b"
    check_no_symlink_parent("a/b/c", {"a/bc"})
    with pytest.raises(ImageError, match="through the symlink 'a/b'"):
        check_no_symlink_parent("a/b/c", {"a/b"})


def test_chain_ids() -> None:
    assert chain_ids([D1]) == ["1" * 64]
    assert chain_ids([D1, D2])[1] == hashlib.sha256(f"{D1} {D2}".encode()).hexdigest()


# -- unpacking crafted layers --------------------------------------------------------------------


def _layer(*entries: tuple[str, str, Any]) -> io.BytesIO:
    """A tar from (kind, name, payload): file (bytes), dir, sym (target), link (target)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for kind, name, payload in entries:
            info = tarfile.TarInfo(name)
            if kind == "file":
                info.size = len(payload)
                tf.addfile(info, io.BytesIO(payload))
                continue
            info.type = {"dir": tarfile.DIRTYPE, "sym": tarfile.SYMTYPE, "link": tarfile.LNKTYPE}[
                kind
            ]
            if kind == "dir":
                info.mode = 0o755
            else:
                info.linkname = payload
            tf.addfile(info)
    buf.seek(0)
    return buf


@pytest.mark.parametrize(
    "entries",
    [
        [("file", "../escape", b"x")],
        [("file", "a/../../escape", b"x")],
        [("sym", "evil", "/"), ("file", "evil/etc/owned", b"x")],
        [("sym", "evil", "../../../../.."), ("file", "evil/tmp/owned", b"x")],
        [("dir", "d", None), ("sym", "d/up", "/etc"), ("file", "d/up/owned", b"x")],
        [("link", "hard", "../../etc/passwd")],
    ],
    ids=["dotdot", "nested-dotdot", "abs-symlink", "rel-symlink", "nested-symlink", "hardlink"],
)
def test_escaping_layers_are_refused(tmp_path: Path, entries: list[tuple[str, str, Any]]) -> None:
    with pytest.raises(ImageError):
        unpack_layer(_layer(*entries), tmp_path / "l", diff_id=None)
    outside = {p.name for p in tmp_path.iterdir()}
    assert outside == {"l"}
    assert not list((tmp_path / "l").rglob("owned"))


def test_symlink_of_a_lower_layer_is_not_written_through(tmp_path: Path) -> None:
    unpack_layer(_layer(("sym", "var/run", "/run")), tmp_path / "l0", diff_id=None)
    with pytest.raises(ImageError, match="layer below"):
        unpack_layer(
            _layer(("file", "var/run/x", b"1")),
            tmp_path / "l1",
            diff_id=None,
            lowers=[tmp_path / "l0"],
        )


def test_layer_unpacks_in_overlay_format_and_checks_diff_id(tmp_path: Path) -> None:
    blob = _layer(
        ("dir", "etc", None),
        ("file", "etc/a", b"A"),
        ("link", "etc/b", "etc/a"),
        ("sym", "var/run", "/run"),
        ("file", "usr/bin/.wh.date", b""),
        ("file", "opt/t/.wh..wh..opq", b""),
        ("file", "opt/t/NEW", b"new"),
    )
    diff_id = "sha256:" + hashlib.sha256(blob.getvalue()).hexdigest()
    unpack_layer(blob, tmp_path / "l", diff_id=diff_id)
    root = tmp_path / "l"
    assert (root / "etc/a").read_bytes() == b"A"
    assert os.stat(root / "etc/a").st_ino == os.stat(root / "etc/b").st_ino
    assert os.readlink(root / "var/run") == "/run"
    st = os.lstat(root / "usr/bin/date")
    assert stat.S_ISCHR(st.st_mode)
    assert st.st_rdev == 0
    assert os.getxattr(root / "opt/t", "trusted.overlay.opaque") == b"y"
    blob.seek(0)
    with pytest.raises(ImageError, match="diff id mismatch"):
        unpack_layer(blob, tmp_path / "l2", diff_id=D1)


# -- a real registry ----------------------------------------------------------------------------


@pytest.fixture
def store(tmp_path: Path) -> OciStore:
    """A cache of its own (for tests of what gets unpacked)."""
    return OciStore(tmp_path / "oci")


@pytest.fixture
def shared_cache(docker_env: DockerEnv) -> Path:
    """One cache for the tests that only boot: every worker process shares it, as hosts do."""
    return docker_env.root / "oci-cache"


def _walk_merged(layers: list[Path], work: Path) -> dict[str, tuple[Any, ...]]:
    """Mount the layers as the sandbox would (overlayfs) and list every entry of the tree."""
    for sub in ("upper", "work", "merged"):
        (work / sub).mkdir(parents=True)
    walker = (
        "import os, sys, json, stat\n"
        "root = sys.argv[1]; out = {}\n"
        "for d, dirs, files in os.walk(root):\n"
        "    for n in dirs + files:\n"
        "        p = os.path.join(d, n); st = os.lstat(p); rel = os.path.relpath(p, root)\n"
        "        kind = 'd' if stat.S_ISDIR(st.st_mode) else 'l' if stat.S_ISLNK(st.st_mode) else 'f'\n"
        "        out[rel] = [kind, stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid,\n"
        "                    st.st_size if kind == 'f' else 0, os.readlink(p) if kind == 'l' else '']\n"
        "print(json.dumps(out))\n"
    )
    lower = ":".join(str(p) for p in reversed(layers))
    script = (
        f'mount -t overlay -o "lowerdir={lower},upperdir=$1/upper,workdir=$1/work" overlay "$1/merged"'
        ' && exec "$2" -c "$3" "$1/merged"'
    )
    out = subprocess.run(
        [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            script,
            "sh",
            str(work),
            sys.executable,
            walker,
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return {k: tuple(v) for k, v in json.loads(out).items()}


# Entries docker adds to every container's file system.
_DOCKER_ONLY = {
    ".dockerenv",
    "dev",
    "proc",
    "sys",
    "etc/hostname",
    "etc/hosts",
    "etc/mtab",
    "etc/resolv.conf",
}


def _export(env: DockerEnv, image: str, dest: Path) -> dict[str, tuple[Any, ...]]:
    cid = env.docker("create", image, "true").strip()
    try:
        env.docker("export", "-o", str(dest), cid)
    finally:
        env.docker("rm", "-f", cid)
    out = {}
    with tarfile.open(dest) as tf:
        for m in tf:
            name = m.name.rstrip("/").removeprefix("./")
            if not name or name.split("/")[0] in _DOCKER_ONLY or name in _DOCKER_ONLY:
                continue
            kind = "d" if m.isdir() else "l" if m.issym() else "f"
            out[name] = (
                kind,
                m.mode & 0o7777,
                m.uid,
                m.gid,
                m.size if m.isfile() else 0,
                m.linkname if m.issym() else "",
            )
    return out


async def test_pull_unpacks_exactly_what_docker_exports(
    docker_env: DockerEnv, store: OciStore, tmp_path: Path
) -> None:
    image = await store.get(docker_env.swe_image)
    assert len(image.layers) == 4  # base, env, instance, and the layer of deletions
    top = image.layers[-1]
    # The deletions are real whiteouts docker recorded: a file, a directory, an opaque directory.
    assert stat.S_ISCHR(os.lstat(top / "usr/bin/cmp").st_mode)
    assert stat.S_ISCHR(os.lstat(top / "usr/lib/python3.11/email/mime").st_mode)
    assert os.getxattr(top / "usr/share/git-core/templates", "trusted.overlay.opaque") == b"y"
    ours = _walk_merged(list(image.layers), tmp_path / "mnt")
    theirs = _export(docker_env, docker_env.swe_image, tmp_path / "export.tar")
    ours = {
        k: v
        for k, v in ours.items()
        if k.split("/")[0] not in _DOCKER_ONLY and k not in _DOCKER_ONLY
    }
    assert "usr/bin/cmp" not in ours
    assert not any(k.startswith("usr/lib/python3.11/email/mime") for k in ours)
    assert [k for k in ours if k.startswith("usr/share/git-core/templates/")] == [
        "usr/share/git-core/templates/NEW"
    ]
    assert len(ours) > 1000
    diff = {
        k: (ours.get(k), theirs.get(k))
        for k in set(ours) | set(theirs)
        if ours.get(k) != theirs.get(k)
    }
    assert diff == {}


async def test_shared_layers_are_stored_once(docker_env: DockerEnv, store: OciStore) -> None:
    a = await store.get(docker_env.swe_image)
    b = await store.get(docker_env.swe_image_b)
    assert a.layers[:2] == b.layers[:2]  # base and env: the same directories
    assert store.statistics().layers_unpacked == 5
    assert store.statistics().layers_reused == 2
    assert len(list((store.root / "layers").iterdir())) == 5
    again = OciStore(store.root)  # another process's view of the same cache: nothing to unpack
    await again.get(docker_env.swe_image)
    assert again.statistics().layers_unpacked == 0


@pytest.fixture
def unique_image(docker_env: DockerEnv, tmp_path: Path) -> Iterator[str]:
    """A one-layer image no other test shares a blob with (so corrupting it harms no one)."""
    src = tmp_path / "u"
    src.mkdir()
    (src / "unique").write_text(uuid.uuid4().hex)
    with tarfile.open(tmp_path / "u.tar", "w") as tf:
        tf.add(src / "unique", arcname="unique")
    ref = f"{docker_env.registry}/trio-swe-test/unique:{uuid.uuid4().hex[:12]}"
    docker_env.docker("import", str(tmp_path / "u.tar"), ref)
    docker_env.docker("push", "-q", ref)
    yield ref
    docker_env.docker("rmi", ref, check=False)


async def test_corrupted_blob_is_refused(
    docker_env: DockerEnv, store: OciStore, unique_image: str
) -> None:
    layer_digest = json.loads(docker_env.docker("manifest", "inspect", "--insecure", unique_image))[
        "layers"
    ][0]["digest"]
    hexd = layer_digest.split(":")[1]
    blob = docker_env.root / "reg/data/docker/registry/v2/blobs/sha256" / hexd[:2] / hexd / "data"
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0xFF
    blob.write_bytes(bytes(data))
    with pytest.raises(ImageError, match="digest mismatch"):
        await store.get(unique_image)
    assert list((store.root / "layers").iterdir()) == []
    assert list((store.root / "tmp").iterdir()) == []


async def test_missing_image_is_a_boot_error(docker_env: DockerEnv, store: OciStore) -> None:
    with pytest.raises(ImageError, match="404"):
        await store.get(f"{docker_env.registry}/trio-swe-test/nope:1")


# -- booting on the local backend --------------------------------------------------------------


async def test_local_boot_is_copy_on_write(docker_env: DockerEnv, shared_cache: Path) -> None:
    backend = LocalBackend(oci_cache_dir=shared_cache)
    async with open_sandbox(backend, docker_env.swe_image, network=False) as sb:
        r = await sb.exec(
            "echo changed > calc/__init__.py && git status --short && test ! -e /usr/bin/cmp"
            " && python3 -c 'import socket; print(socket.if_nameindex())'"
        )
        assert r.output == " M calc/__init__.py\n[(1, 'lo')]\n", r
        who = await exec_and_wait(
            sb,
            "id -un; touch /testbed/by-agent",
            time_budget_sec=60,
            user="agent",
            want_output=True,
        )
        assert who.output.startswith("agent\n")
    async with open_sandbox(backend, docker_env.swe_image) as sb:  # the next one sees the image
        r = await sb.exec("git status --short; cat /usr/share/git-core/templates/NEW")
        assert r.output == "new\n"
    oci = backend.statistics().oci
    assert oci.layers_unpacked + oci.layers_reused == 4
    assert backend.statistics().live == 0


@pytest.mark.docker_full
async def test_layouts_and_docker_save_tarballs(
    docker_env: DockerEnv, tmp_path: Path, shared_cache: Path
) -> None:
    archive = tmp_path / "b.tar"
    docker_env.docker("save", "-o", str(archive), docker_env.swe_image_b)
    sources = [f"docker-archive:{archive}"]
    if shutil.which("skopeo"):
        layout = tmp_path / "layout"
        await trio.run_process(
            ["skopeo", "copy", "-q", "--src-daemon-host", docker_env.docker_host,
             f"docker-daemon:{docker_env.swe_image_b}", f"oci:{layout}:b"],
            capture_stdout=True, capture_stderr=True,
        )  # fmt: skip
        sources.append(f"oci:{layout}:b")
    backend = LocalBackend(oci_cache_dir=shared_cache)
    for source in sources:
        async with open_sandbox(backend, source) as sb:
            assert await sb.read_file("/testbed/README") == b"instance b\n"


@pytest.mark.swebench
@pytest.mark.parametrize(
    ("outcome", "reward"),
    [
        ("gold", 1.0),
        pytest.param("empty", 0.0, marks=pytest.mark.docker_full),
        pytest.param("break_p2p", 0.0, marks=pytest.mark.docker_full),
    ],
)
async def test_swebench_row_on_local_backend_from_the_registry(
    docker_env: DockerEnv, tmp_path: Path, shared_cache: Path, outcome: str, reward: float
) -> None:
    # No grading shims: the image carries its own activate script and testbed env.
    calc = dataclasses.replace(build_calc_repo(tmp_path), base=docker_env.calc_base)
    md = get_metadata(calc.swebench_v5_row(image=docker_env.swe_image), "swebench")
    backend = LocalBackend(
        oci_cache_dir=tmp_path / "oci", env={"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    )
    patch = "" if outcome == "empty" else getattr(calc, outcome)
    result = await run_evaluation(backend, md, patch, timeout_sec=120)
    assert result.reward == reward, f"{result.reason}: {result.detail}\n{result.log_tail[-1500:]}"

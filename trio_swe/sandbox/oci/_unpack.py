"""Unpacking one layer blob into a directory in overlayfs' format (blocking; run in a thread).

The entry rules and safety checks are the sans-IO ones of ``_plan``; this module only applies
them to the disk, never following a symlink it did not check.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import os
import shutil
import stat
import subprocess
import tarfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO

from ._manifest import ImageError
from ._plan import check_no_symlink_parent, hardlink_target, plan_entry

_GZIP = b"\x1f\x8b"
_ZSTD = b"\x28\xb5\x2f\xfd"
OPAQUE_XATTR = "trusted.overlay.opaque"


class _Hashing:
    """A read-only file object that hashes what passes through (the layer's diff id)."""

    def __init__(self, inner: IO[bytes]) -> None:
        self._inner = inner
        self.sha = hashlib.sha256()

    def read(self, n: int = -1) -> bytes:
        data = self._inner.read(n)
        self.sha.update(data)
        return data


@contextlib.contextmanager
def open_layer(raw: IO[bytes]) -> Iterator[IO[bytes]]:
    """The uncompressed tar stream of a layer blob (gzip, zstd if available, or plain tar).

    gzip is decompressed by a ``pigz``/``gzip -dc`` child process where there is one: it runs
    on another core while this thread parses the tar (a layer unpacks about twice as fast).
    """
    head = raw.read(4)
    raw.seek(0)
    if head[:2] == _GZIP:
        tool = shutil.which("pigz") or shutil.which("gzip")
        try:
            raw.fileno()
        except (OSError, AttributeError, ValueError):
            tool = None  # not a real file (e.g. in memory): decompress here
        if tool is None:
            yield gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[misc]
            return
        os.lseek(raw.fileno(), 0, os.SEEK_SET)  # the buffered read above moved the fd's offset
        proc = subprocess.Popen(
            [tool, "-dc"],
            stdin=raw,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            bufsize=1 << 20,
        )
        assert proc.stdout is not None
        assert proc.stderr is not None
        try:
            yield proc.stdout
            proc.stdout.read()  # to the end, so the exit status means something
        finally:
            proc.stdout.close()
            err = proc.stderr.read()
            proc.stderr.close()
            if proc.wait() != 0:
                raise ImageError(
                    f"corrupt layer: {tool} -dc: {err.decode(errors='replace').strip()}"
                )
        return
    if head == _ZSTD:
        try:
            import zstandard  # type: ignore[import-not-found]
        except ImportError:
            raise ImageError("a zstd-compressed layer needs the 'zstandard' package") from None
        yield zstandard.ZstdDecompressor().stream_reader(raw)
        return
    yield raw


def _remove(path: Path) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path)
    else:
        os.unlink(path)


class _LayerWriter:
    def __init__(self, dest: Path, lowers: Sequence[Path]) -> None:
        self.dest = dest
        self.lowers = list(lowers)  # top first
        self.symlinks: set[str] = set()
        self.dirs: set[str] = set()
        self.checked_lower: dict[str, bool] = {}
        self.dir_meta: list[tuple[Path, tarfile.TarInfo]] = []

    # -- checks ---------------------------------------------------------------------------------
    def _check_parents(self, path: str) -> None:
        check_no_symlink_parent(path, self.symlinks)
        parts = path.split("/")
        for i in range(1, len(parts)):
            prefix = "/".join(parts[:i])
            if prefix in self.dirs:
                continue
            bad = self.checked_lower.get(prefix)
            if bad is None:
                bad = False
                for lower in self.lowers:
                    p = lower / prefix
                    if os.path.lexists(p):
                        bad = os.path.islink(p)
                        break
                self.checked_lower[prefix] = bad
            if bad:
                raise ImageError(
                    f"layer entry {path!r} would be written through the symlink {prefix!r} of a "
                    "layer below"
                )

    def _parent_dirs(self, path: str) -> None:
        parts = path.split("/")
        for i in range(1, len(parts)):
            prefix = "/".join(parts[:i])
            if prefix in self.dirs:
                continue
            p = self.dest / prefix
            try:
                st = os.lstat(p)
                if not stat.S_ISDIR(st.st_mode):
                    os.unlink(p)
                    raise FileNotFoundError
            except FileNotFoundError:
                os.mkdir(p, 0o755)
            self.dirs.add(prefix)

    # -- entries --------------------------------------------------------------------------------
    def apply(self, m: tarfile.TarInfo, tf: tarfile.TarFile) -> None:
        action = plan_entry(m.name)
        if action is None:
            if m.isdir():
                self.dir_meta.append((self.dest, m))
            return
        path = action.path
        if action.kind == "opaque":
            if path != ".":
                self._check_parents(path + "/x")
                self._parent_dirs(path + "/x")
            os.setxattr(self.dest / path, OPAQUE_XATTR, b"y", follow_symlinks=False)
            return
        self._check_parents(path)
        self._parent_dirs(path)
        target = self.dest / path
        if action.kind == "whiteout":
            _remove(target)
            self.symlinks.discard(path)
            os.mknod(target, stat.S_IFCHR | 0o600, os.makedev(0, 0))
            return
        if m.isdir():
            try:
                if not stat.S_ISDIR(os.lstat(target).st_mode):
                    os.unlink(target)
                    raise FileNotFoundError
            except FileNotFoundError:
                os.mkdir(target, 0o755)
            self.symlinks.discard(path)
            self.dirs.add(path)
            self.dir_meta.append((target, m))
            self._xattrs(target, m)
            return
        _remove(target)
        self.symlinks.discard(path)
        self.dirs.discard(path)
        if m.isfile():
            src = tf.extractfile(m)
            assert src is not None
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as out:
                shutil.copyfileobj(src, out, 1 << 20)
                os.fchown(out.fileno(), m.uid, m.gid)
                os.fchmod(out.fileno(), m.mode & 0o7777)
            os.utime(target, (m.mtime, m.mtime), follow_symlinks=False)
        elif m.issym():
            os.symlink(m.linkname, target)
            os.lchown(target, m.uid, m.gid)
            self.symlinks.add(path)
        elif m.islnk():
            link = hardlink_target(m.linkname)
            self._check_parents(link)
            source = self.dest / link
            if not os.path.lexists(source):
                # The target lives in a layer below: copy it up into this one first.
                for lower in self.lowers:
                    if os.path.lexists(lower / link):
                        self._parent_dirs(link)
                        shutil.copy2(lower / link, source, follow_symlinks=False)
                        break
                else:
                    raise ImageError(f"hard link {path!r} -> {m.linkname!r}: no such target")
            if os.path.isdir(source) and not os.path.islink(source):
                raise ImageError(f"hard link {path!r} -> {m.linkname!r}: a directory")
            os.link(source, target, follow_symlinks=False)
            return
        elif m.ischr() or m.isblk():
            kind = stat.S_IFCHR if m.ischr() else stat.S_IFBLK
            os.mknod(target, kind | (m.mode & 0o7777), os.makedev(m.devmajor, m.devminor))
            os.lchown(target, m.uid, m.gid)
        elif m.isfifo():
            os.mkfifo(target, m.mode & 0o7777)
            os.lchown(target, m.uid, m.gid)
        else:
            raise ImageError(f"layer entry {m.name!r}: unsupported tar type {m.type!r}")
        self._xattrs(target, m)

    def _xattrs(self, target: Path, m: tarfile.TarInfo) -> None:
        for key, value in m.pax_headers.items():
            if key.startswith("SCHILY.xattr."):
                name = key.removeprefix("SCHILY.xattr.")
                if name.startswith("trusted.overlay."):
                    continue  # only our own whiteout marks may say that
                try:
                    os.setxattr(
                        target,
                        name,
                        value.encode("utf-8", "surrogateescape"),
                        follow_symlinks=False,
                    )
                except OSError:
                    pass  # e.g. security.* where the file system refuses: not needed to run

    def finish(self) -> None:
        # Directory modes and times last: writing into them changed their mtime.
        for target, m in reversed(self.dir_meta):
            os.lchown(target, m.uid, m.gid)
            os.chmod(target, m.mode & 0o7777)
            os.utime(target, (m.mtime, m.mtime), follow_symlinks=False)


def unpack_layer(
    blob: IO[bytes], dest: Path, *, diff_id: str | None, lowers: Sequence[Path] = ()
) -> None:
    """Unpack the layer ``blob`` into the new directory ``dest`` (overlayfs format).

    Args:
        blob: the layer blob (compressed or not), positioned at its start.
        dest: a directory to create; on failure its contents are undefined (remove it).
        diff_id: the expected sha256 of the uncompressed tar (checked); None skips the check.
        lowers: the unpacked layers below, top first (symlink checks, hard-link copy-ups).

    Raises:
        ImageError: an unsafe entry, a corrupt stream, or a diff id mismatch.
    """
    dest.mkdir(mode=0o755)
    writer = _LayerWriter(dest, lowers)
    try:
        with open_layer(blob) as plain:
            stream = _Hashing(plain)
            with tarfile.open(fileobj=stream, mode="r|", bufsize=1 << 20) as tf:  # type: ignore[call-overload]
                for member in tf:
                    writer.apply(member, tf)
            while stream.read(1 << 20):
                pass  # the tar's padding counts in the diff id
    except (tarfile.TarError, EOFError, gzip.BadGzipFile, OSError) as exc:
        if isinstance(exc, ImageError):
            raise
        raise ImageError(f"corrupt layer: {exc}") from exc
    writer.finish()
    if diff_id is not None:
        got = "sha256:" + stream.sha.hexdigest()
        if got != diff_id:
            raise ImageError(f"layer diff id mismatch: expected {diff_id}, got {got}")


def read_file_in(layers_top_first: Sequence[Path], rel: str) -> str | None:
    """A regular file of the image (the topmost layer that has it), or None."""
    for layer in layers_top_first:
        p = layer / rel
        try:
            st = os.lstat(p)
        except FileNotFoundError:
            continue
        return p.read_text(errors="replace") if stat.S_ISREG(st.st_mode) else None
    return None

"""Local images: a directory, or ``path@commit`` of a git repository checked out once and cached."""

from __future__ import annotations

import hashlib
import math
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import trio

from ..._errors import PermanentBootError, SandboxBootError
from .._keyed import KeyedLock


def split_image(image: str) -> tuple[Path, str | None]:
    """``"/repo@abc123"`` -> (``/repo``, ``"abc123"``); a plain directory -> (dir, None).

    A directory whose own name contains ``@`` is taken as a directory, not as ``path@commit``.
    """
    if os.path.isdir(image):
        return Path(image), None
    path, sep, commit = image.rpartition("@")
    if not sep or not path or not commit:
        raise PermanentBootError(f"local image {image!r}: not a directory, and not 'path@commit'")
    return Path(path), commit


def check_local_image(image: str, commit: str | None = None) -> str | None:
    """Why the local backend cannot boot ``image`` (or boots another commit), or None.

    ``commit``: the commit the checkout must be (the row's ``base_commit``; a prefix of at
    least 7 hex digits matches, as git's short ids do).
    """
    try:
        path, rev = split_image(image)
    except SandboxBootError as exc:
        return f"image_not_local:{exc}"
    if rev is None and not path.is_dir():
        return f"image_not_local:local image {image!r}: {path} is not a directory"
    if rev is None and not (path / ".git").exists():
        return None  # a plain directory: no commit to check
    if rev is not None and not (path / ".git").exists() and not (path / "HEAD").exists():
        return f"image_not_local:local image {image!r}: {path} is not a git repository"
    try:
        out = subprocess.run(
            [
                "git",
                "-C",
                str(path),
                "rev-parse",
                "--verify",
                "--quiet",
                f"{rev or 'HEAD'}^{{commit}}",
            ],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"image_not_local:git rev-parse failed for {image!r}: {exc}"
    sha = out.stdout.strip()
    if out.returncode != 0 or not sha:
        return f"image_commit_missing:{path} has no commit {rev or 'HEAD'!r}"
    return commit_mismatch(image, sha, commit)


def commit_mismatch(image: str, sha: str, commit: str | None) -> str | None:
    """``base_commit_mismatch:...`` when ``image`` checks out ``sha`` and ``commit`` (a prefix
    of at least 7 hex digits, or the full id) names another commit; None when it matches or
    when there is no ``commit`` to check."""
    want = (commit or "").strip().lower()
    if want and not (len(want) >= 7 and sha.lower().startswith(want)):
        return f"base_commit_mismatch:image {image!r} checks out {sha}, the row's base_commit is {want}"
    return None


_FULL_SHA = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")


def _key(repo: Path, sha: str) -> str:
    """The cache entry of ``repo`` (resolved) at commit ``sha`` (full, lowercase)."""
    return hashlib.sha256(f"{repo}\0{sha}".encode()).hexdigest()[:24]


async def _git(*args: str) -> str:
    result = await trio.run_process(
        ["git", *args], capture_stdout=True, capture_stderr=True, check=False
    )
    if result.returncode != 0:
        err = result.stderr.decode(errors="replace").strip()
        raise SandboxBootError(f"git {' '.join(args)} failed: {err}")
    return result.stdout.decode().strip()


async def _settle_index(checkout: Path) -> None:
    """Make the checkout's index trusted as it is, so ``git status`` in a sandbox is cheap.

    git trusts an index entry's stat data only when the file is older than the index file
    (by whole seconds); entries written in the same second as the index are "racily clean"
    and are re-hashed by every ``git status``/``git diff``. Every sandbox starts from this
    index (its copy-on-write upper layer is fresh), so each would re-hash them again. Once
    the clock has passed the index's second, one refresh rewrites it trusted (at most a
    second's wait, once per image).
    """
    index = checkout / ".git" / "index"
    try:
        mtime = index.stat().st_mtime
    except FileNotFoundError:
        return
    await trio.sleep(max(0.0, math.floor(mtime) + 1.05 - time.time()))
    await trio.run_process(
        ["git", "-C", str(checkout), "update-index", "-q", "--refresh"],
        capture_stdout=True,
        capture_stderr=True,
        check=False,  # "needs update" lines are not failures; the index is only an optimisation
    )


class ImageCache:
    """Checkouts of ``path@commit`` images under ``root``, built once, shared read-only.

    A checkout is built in a temporary directory and renamed into place, so a crash mid-build
    never leaves a half-made image that a later boot would use.
    """

    def __init__(self, root: Path) -> None:
        self._root = root
        self._locks = KeyedLock()

    def cached(self, image: str) -> tuple[Path, str] | None:
        """``(checkout, commit)`` of a ``path@<full commit id>`` image already built, found
        without running git (the checkout was made from exactly that commit); else None."""
        try:
            path, commit = split_image(image)
        except SandboxBootError:
            return None
        if commit is None or not _FULL_SHA.fullmatch(commit.lower()):
            return None
        sha = commit.lower()
        final = self._root / _key(path.resolve(), sha)
        return (final, sha) if final.is_dir() else None

    async def resolve(self, image: str) -> Path:
        """The host directory to mount for ``image``."""
        hit = self.cached(image)
        if hit is not None:
            return hit[0]
        path, commit = split_image(image)
        if commit is None:
            return path.resolve()
        if not (path / ".git").exists() and not (path / "HEAD").exists():
            raise PermanentBootError(f"local image {image!r}: {path} is not a git repository")
        repo = path.resolve()
        found = await trio.run_process(
            ["git", "-C", str(repo), "rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}"],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
        if found.returncode == 1 and not found.stdout.strip():
            # --verify --quiet: status 1 and no output means "no such commit", nothing else.
            raise PermanentBootError(f"local image {image!r}: no commit {commit!r} in {repo}")
        if found.returncode != 0:
            err = found.stderr.decode(errors="replace").strip()
            raise SandboxBootError(f"local image {image!r}: git rev-parse failed: {err}")
        sha = found.stdout.decode().strip()
        key = _key(repo, sha)
        final = self._root / key
        async with self._locks.hold(key):
            if final.is_dir():
                return final
            self._root.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=self._root))
            try:
                checkout = tmp / "tree"
                await _git("clone", "--quiet", "--no-checkout", str(repo), str(checkout))
                await _git("-C", str(checkout), "checkout", "--quiet", "--detach", sha)
                await _settle_index(checkout)
                try:
                    checkout.rename(final)
                except OSError:
                    if not final.is_dir():  # lost a race to another process: theirs is as good
                        raise
            finally:
                with trio.CancelScope(shield=True):
                    await trio.to_thread.run_sync(shutil.rmtree, tmp, True)
        return final

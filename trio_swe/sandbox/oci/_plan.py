"""Sans-IO: what each tar entry of a layer does, and the checks that keep it inside the root.

A layer is unpacked into a directory of its own, in overlayfs' format, so that layers shared by
images are stored once and an image is the overlay of its layer directories:

* ``.wh.NAME`` (a whiteout) deletes ``NAME`` of the layers below: it becomes a character device
  0/0 named ``NAME``, which is how overlayfs marks a deletion;
* ``.wh..wh..opq`` (an opaque marker) hides everything the layers below have in that directory:
  the directory gets the ``trusted.overlay.opaque=y`` attribute;
* any other entry is created as it is.

Safety: an entry's name must stay inside the layer (no ``..`` climbing out, absolute names are
taken relative to the root), and nothing is ever written *through* a symlink: an entry whose
parent directory is a symlink in the layer is refused (a layer made by diffing a real file
system never has one). Hard links must name an entry inside the root. Symlink *targets* may
point anywhere: they are resolved inside the sandbox, whose root is the image.
"""

from __future__ import annotations

import posixpath
from typing import Final, Literal

import msgspec

from ._manifest import ImageError

WHITEOUT_PREFIX: Final = ".wh."
OPAQUE: Final = ".wh..wh..opq"


class Action(msgspec.Struct, frozen=True):
    """What to do for one entry: ``path`` is relative to the layer root, never empty."""

    kind: Literal["create", "whiteout", "opaque"]
    path: str


def clean_path(name: str, what: str = "layer entry") -> str:
    """``name`` as a relative path inside the root, or :class:`ImageError` if it escapes."""
    if "\x00" in name:
        raise ImageError(f"{what} {name!r}: NUL in the name")
    stripped = name.lstrip("/")
    parts: list[str] = []
    for part in stripped.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if not parts:
                raise ImageError(f"{what} {name!r} climbs out of the root")
            parts.pop()
            continue
        parts.append(part)
    return "/".join(parts)


def plan_entry(name: str) -> Action | None:
    """The action of the tar entry ``name`` (None: the root itself, nothing to do)."""
    path = clean_path(name)
    if not path:
        return None
    parent, base = posixpath.split(path)
    if base == OPAQUE:
        if not parent:
            return Action("opaque", ".")
        return Action("opaque", parent)
    if base.startswith(WHITEOUT_PREFIX):
        target = base[len(WHITEOUT_PREFIX) :]
        if not target or target in (".", ".."):
            raise ImageError(f"layer entry {name!r}: a whiteout of nothing")
        return Action("whiteout", posixpath.join(parent, target))
    return Action("create", path)


def check_no_symlink_parent(path: str, symlinks: set[str] | frozenset[str]) -> None:
    """Refuse ``path`` if one of its parent directories is a symlink of the layer."""
    parts = path.split("/")
    for i in range(1, len(parts)):
        if "/".join(parts[:i]) in symlinks:
            raise ImageError(
                f"layer entry {path!r} would be written through the symlink {'/'.join(parts[:i])!r}"
            )


def hardlink_target(linkname: str) -> str:
    """A hard link's target, relative to the root (it must name an entry inside it)."""
    path = clean_path(linkname, "hard link target")
    if not path:
        raise ImageError(f"hard link to the root itself ({linkname!r})")
    return path

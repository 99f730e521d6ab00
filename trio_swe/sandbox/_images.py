"""The image-mapping hook: which image a backend boots for a dataset row (sans-IO).

A row names an image in its own terms (SWE-bench: ``swebench/sweb.eval.x86_64.<id>:latest``, a
Docker Hub name). What a backend can boot differs: the local backend boots a directory or
``path@commit``, E2B a template, Docker an image reference. A backend may therefore define

* ``image_for(md) -> str``: the image it boots for the instance ``md`` (an
  :class:`~trio_swe.grading.InstanceMetadata`; ``md.image`` is the row's own), and
* ``check_image(image, *, commit) -> str | None``: a cheap check, before anything boots, that it
  can boot ``image`` and (when ``commit`` is given, the row's ``base_commit``) that the image's
  checkout is that commit; a short reason if not.

Both are optional; without them the row's image is booted as it is. :class:`ImageMap` is the
usual implementation of ``image_for``: a mapping by instance id, or a function of the metadata.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeAlias

#: Row -> image: instance id -> image, or a function of the instance metadata (None: the
#: row's own image).
ImageSource: TypeAlias = Mapping[str, str] | Callable[[Any], "str | None"]


class ImageMap:
    """``image_for`` from an :data:`ImageSource`, falling back to the row's image."""

    def __init__(self, source: ImageSource | None = None) -> None:
        self._source = source

    def __call__(self, md: Any) -> str:
        src = self._source
        image: str | None
        if src is None:
            image = None
        elif isinstance(src, Mapping):
            image = src.get(md.instance_id)
        else:
            image = src(md)
        return image if image else str(md.image)


def image_for(backend: Any, md: Any) -> str:
    """What ``backend`` boots for ``md``: its ``image_for`` hook, else the row's image."""
    hook = getattr(backend, "image_for", None)
    image = hook(md) if callable(hook) else None
    return str(image) if image else str(md.image)


def check_image(backend: Any, image: str, *, commit: str | None) -> str | None:
    """The backend's ``check_image`` verdict on ``image`` (None when it has no such check)."""
    hook = getattr(backend, "check_image", None)
    if not callable(hook):
        return None
    reason = hook(image, commit=commit or None)
    return None if reason is None else str(reason)

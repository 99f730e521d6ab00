"""OCI images without a daemon: pulled (registry, OCI layout, ``docker save`` tarball), unpacked
layer by layer into a shared content-addressed cache, booted copy-on-write by the local backend."""

from ._manifest import ImageError, Reference, parse_reference
from ._store import OciImage, OciStore, OciStoreStatistics, is_oci_image, parse_source

__all__ = [
    "ImageError",
    "OciImage",
    "OciStore",
    "OciStoreStatistics",
    "Reference",
    "is_oci_image",
    "parse_reference",
    "parse_source",
]

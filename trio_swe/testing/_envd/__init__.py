"""Private implementation of :mod:`trio_swe.testing`'s envd-compatible server."""

"""Adapters that plug trio_swe into training frameworks (each imported on its own).

* :mod:`trio_swe.integrations.slime` — slime's custom generate function
  (``--custom-generate-function-path trio_swe.generate``).

They sit above :mod:`trio_swe.aio` (the asyncio bridge) and :mod:`trio_swe.rollout`; nothing in
the library imports them except the top-level re-export of ``generate``.
"""

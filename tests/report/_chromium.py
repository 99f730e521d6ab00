"""Headless Chromium driven over its DevTools protocol on a pipe (``--remote-debugging-pipe``).

No client library and no browser download: Debian's ``chromium`` reads JSON commands from fd 3
and writes responses and events to fd 4, each message ended by a NUL byte. The browser runs in
its own process group, killed on the way out, so nothing it spawned outlives the test.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import trio

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


class DevToolsError(Exception):
    """A DevTools command answered with an error."""


class Chromium:
    """One browser; commands go to the browser, or to a page's session with ``session=``."""

    def __init__(self, send_stream: trio.lowlevel.FdStream) -> None:
        self._send_stream = send_stream
        self._ids = itertools.count(1)
        self._pending: dict[int, tuple[trio.Event, list[dict[str, Any]]]] = {}
        self.events: list[dict[str, Any]] = []
        self._new_event = trio.Event()

    async def _read(self, receive: trio.lowlevel.FdStream) -> None:
        buf = b""
        while chunk := await receive.receive_some(1 << 16):
            buf += chunk
            *messages, buf = buf.split(b"\0")
            for raw in messages:
                message = json.loads(raw)
                if "id" in message:
                    event, slot = self._pending.pop(message["id"])
                    slot.append(message)
                    event.set()
                else:
                    self.events.append(message)
                    self._new_event.set()
                    self._new_event = trio.Event()

    async def send(
        self, method: str, params: dict[str, Any] | None = None, *, session: str | None = None
    ) -> dict[str, Any]:
        """Send a command; its ``result`` (raises :class:`DevToolsError` on an error)."""
        cid = next(self._ids)
        message: dict[str, Any] = {"id": cid, "method": method, "params": params or {}}
        if session is not None:
            message["sessionId"] = session
        done, slot = trio.Event(), []
        self._pending[cid] = (done, slot)
        await self._send_stream.send_all(json.dumps(message).encode() + b"\0")
        await done.wait()
        reply = slot[0]
        if "error" in reply:
            raise DevToolsError(f"{method}: {reply['error']}")
        result: dict[str, Any] = reply.get("result", {})
        return result

    async def wait_event(self, method: str, *, session: str | None = None) -> dict[str, Any]:
        """The first event ``method`` (of ``session``) received so far, or the next one."""
        seen = 0
        while True:
            for event in self.events[seen:]:
                if event["method"] == method and event.get("sessionId") == session:
                    return event
            seen = len(self.events)
            await self._new_event.wait()

    async def open_page(self) -> str:
        """A new blank page with its console, log, network and page events on; its session."""
        target = await self.send("Target.createTarget", {"url": "about:blank"})
        attached = await self.send(
            "Target.attachToTarget", {"targetId": target["targetId"], "flatten": True}
        )
        session: str = attached["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            await self.send(f"{domain}.enable", session=session)
        return session

    async def evaluate(self, expression: str, *, session: str) -> Any:
        """The value of ``expression`` in the page (awaited when it is a promise)."""
        reply = await self.send(
            "Runtime.evaluate",
            {"expression": expression, "awaitPromise": True, "returnByValue": True},
            session=session,
        )
        if "exceptionDetails" in reply:
            raise DevToolsError(f"{expression[:80]}: {reply['exceptionDetails']}")
        return reply["result"].get("value")

    def console_errors(self) -> list[str]:
        """Console errors, uncaught exceptions and error log entries (failed loads) so far."""
        errors = []
        for event in self.events:
            method, params = event["method"], event.get("params", {})
            if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                errors.append(
                    "console: " + " ".join(str(a.get("value")) for a in params.get("args", []))
                )
            elif method == "Runtime.exceptionThrown":
                errors.append(f"exception: {params['exceptionDetails']}")
            elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
                errors.append(f"log: {params['entry']['text']} {params['entry'].get('url', '')}")
        return errors

    def requested_urls(self) -> list[str]:
        """Every URL the pages asked for."""
        return [
            e["params"]["request"]["url"]
            for e in self.events
            if e["method"] == "Network.requestWillBeSent"
        ]


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@asynccontextmanager
async def open_chromium(profile: Path, *extra: str) -> AsyncIterator[Chromium]:
    """Headless Chromium with a fresh profile in ``profile``, driven over the pipe."""
    assert CHROMIUM is not None
    to_browser_r, to_browser_w = os.pipe()
    from_browser_r, from_browser_w = os.pipe()
    args = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",  # root in CI containers; the page is our own file
        "--disable-gpu",
        "--no-first-run",
        "--no-default-browser-check",
        "--disable-extensions",
        "--remote-debugging-pipe",
        f"--user-data-dir={profile}",
        *extra,
    ]
    # The protocol's fds are 3 (commands in) and 4 (replies out) in the browser.
    script = f'exec "$@" 3<&{to_browser_r} 4>&{from_browser_w}'
    cmd = ["bash", "-c", script, "bash", *args]  # dash refuses fds above 9
    send = trio.lowlevel.FdStream(to_browser_w)
    receive = trio.lowlevel.FdStream(from_browser_r)
    try:
        async with trio.open_nursery() as nursery:
            proc: trio.Process = await nursery.start(
                partial(
                    trio.run_process,
                    cmd,
                    pass_fds=(to_browser_r, from_browser_w),
                    start_new_session=True,
                    stdout=subprocess.DEVNULL,
                    stderr=None if os.environ.get("CHROMIUM_STDERR") else subprocess.DEVNULL,
                    check=False,
                    deliver_cancel=lambda p: trio.to_thread.run_sync(_kill_group, p.pid),
                )
            )
            os.close(to_browser_r)
            os.close(from_browser_w)
            browser = Chromium(send)
            nursery.start_soon(browser._read, receive)
            try:
                with trio.fail_after(60):
                    yield browser
            finally:
                with trio.CancelScope(shield=True), trio.move_on_after(10):
                    try:
                        await browser.send("Browser.close")
                    except (DevToolsError, trio.BrokenResourceError, trio.ClosedResourceError):
                        pass
                    await proc.wait()
                _kill_group(proc.pid)  # whatever the browser left behind in its group
                nursery.cancel_scope.cancel()
    finally:
        await send.aclose()
        await receive.aclose()

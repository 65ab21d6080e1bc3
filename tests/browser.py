"""Headless Chromium driven over the DevTools protocol on a pipe (no extra packages).

``chromium --remote-debugging-pipe`` reads protocol messages on fd 3 and writes on fd 4,
each a JSON object ending in a NUL byte. A bash ``exec`` moves our stdin/stdout pipes to
those descriptors, so the client is a few reads and writes: attach to the page, navigate,
evaluate, take screenshots. Every wait has a deadline; nothing sleeps a fixed time.
"""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import DEADLINE_S


def chromium_bin() -> str:
    """The chromium binary, or a loud failure naming the Debian package."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.fail("chromium is not installed: apt-get install -y chromium (scripts/test does)")
    return found


class Browser:
    """One headless Chromium with one page.

    Args:
        width: viewport width, px.
        height: viewport height, px.
    """

    def __init__(self, width: int = 1400, height: int = 2600) -> None:
        self._profile = tempfile.TemporaryDirectory(prefix="fiomon-chromium-")
        argv = [
            chromium_bin(),
            "--headless",
            "--no-sandbox",  # tests run as root in CI containers
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--remote-debugging-pipe",
            f"--user-data-dir={self._profile.name}",
            f"--window-size={width},{height}",
            "about:blank",
        ]
        self.proc = subprocess.Popen(
            ["bash", "-c", 'exec "$@" 3<&0 4>&1 0</dev/null 1>/dev/null', "chromium", *argv],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self._w = self.proc.stdin
        self._r = self.proc.stdout.fileno()
        self._buf = b""
        self._id = 0
        self.session = ""
        self.errors: list[str] = []  # uncaught exceptions and console.error calls in the page
        targets = self.call("Target.getTargets")["targetInfos"]
        page = next(t for t in targets if t["type"] == "page")
        self.session = self.call(
            "Target.attachToTarget", targetId=page["targetId"], flatten=True, session=False
        )["sessionId"]
        self.call("Page.enable")
        self.call("Runtime.enable")

    def call(self, method: str, session: bool = True, **params: Any) -> dict[str, Any]:
        """Send one command and return its result (events in between are skipped)."""
        self._id += 1
        msg: dict[str, Any] = {"id": self._id, "method": method, "params": params}
        if session and self.session:
            msg["sessionId"] = self.session
        self._w.write(json.dumps(msg).encode() + b"\0")
        self._w.flush()
        deadline = time.monotonic() + DEADLINE_S
        while True:
            reply = self._read(deadline)
            self._note(reply)
            if reply.get("id") == self._id:
                if "error" in reply:
                    text = f"{method}: {reply['error']}"
                    raise RuntimeError(text)
                result: dict[str, Any] = reply.get("result", {})
                return result

    def _note(self, event: dict[str, Any]) -> None:
        """Keep the page's errors (events read while waiting for a reply)."""
        method = event.get("method")
        params = event.get("params", {})
        if method == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails", {})
            self.errors.append(str(details.get("exception", {}).get("description", details)))
        elif method == "Runtime.consoleAPICalled" and params.get("type") == "error":
            self.errors.append(" ".join(str(a.get("value", a)) for a in params.get("args", [])))

    def _read(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._r], [], [], left)[0]:
                pytest.fail(f"chromium did not answer within {DEADLINE_S:g} s")
            chunk = os.read(self._r, 1 << 20)
            if not chunk:
                pytest.fail("chromium exited")
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\0")
        out: dict[str, Any] = json.loads(line)
        return out

    def goto(self, url: str) -> None:
        """Navigate (returns once the navigation started; wait on page state after)."""
        self.call("Page.navigate", url=url)

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page."""
        got = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in got:
            msg = f"{expression}: {got['exceptionDetails']}"
            raise RuntimeError(msg)
        return got["result"].get("value")

    def wait_for(self, expression: str, what: str, within: float = DEADLINE_S) -> Any:
        """Poll ``expression`` until it is truthy; its value, or fail naming ``what``."""
        deadline = time.monotonic() + within
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                pytest.fail(f"not within {within:g} s: {what}")
            time.sleep(0.1)

    def state(self) -> dict[str, Any]:
        """``window.fiomonState``: what the page's charts hold (see fiomon/web/fiomon.js)."""
        text = self.wait_for(
            "window.fiomonState && window.fiomonState.rendered"
            " && JSON.stringify(window.fiomonState)",
            "the page drew its charts",
        )
        out: dict[str, Any] = json.loads(text)
        return out

    def screenshot(self, path: Path) -> None:
        """Save a PNG of the whole page.

        The viewport is first grown to the page's height and the charts redrawn for it
        (waiting until they say they are drawn): capturing beyond the viewport would
        resize the page under the charts while they paint.
        """
        width = int(self.evaluate("document.documentElement.clientWidth"))
        height = int(self.evaluate("document.documentElement.scrollHeight"))
        self.call(
            "Emulation.setDeviceMetricsOverride",
            width=width,
            height=height,
            deviceScaleFactor=1,
            mobile=False,
        )
        self.evaluate("window.fiomonRenderer && window.fiomonRenderer.resizeAll(), 0")
        self.wait_for("!window.fiomonRenderer || window.fiomonState.rendered", "the charts redrawn")
        shot = self.call("Page.captureScreenshot", format="png")
        path.write_bytes(base64.b64decode(shot["data"]))

    def close(self) -> None:
        """Stop Chromium (closing its pipe ends it; killed if it lingers)."""
        with_timeout = 10
        try:
            self._w.close()
            self.proc.wait(with_timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        finally:
            if self.proc.stdout is not None:
                self.proc.stdout.close()
            self._profile.cleanup()

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

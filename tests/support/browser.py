"""report.html / sweep.html in headless Chromium: `Chromium(binary).load(url, ...)` opens a page
over the DevTools pipe (--remote-debugging-pipe, no Python browser package) with every host name
made unresolvable, and returns the screenshot, the console errors and every request it made."""
from __future__ import annotations

import base64
import fcntl
import io
import json
import os
import select
import shlex
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")


@dataclass
class BrowserRun:
    png: bytes
    console_errors: list[str]
    requests: list[str]          # every URL the page asked for, the page itself included
    scroll_width: int            # document width: > the window means sideways scrolling


def chromium_or_skip() -> str:
    found = next((shutil.which(name) for name in CHROMIUM_NAMES if shutil.which(name)), None)
    if found is None or shutil.which("bash") is None:
        pytest.skip("no chromium binary on PATH: `make install` installs Debian's chromium "
                    "where apt-get runs as root; else `apt-get install chromium` (and bash)")
    return found


class Chromium:
    """One headless Chromium driven over --remote-debugging-pipe (its fds 3 / 4), every host
    name unresolvable; `load()` opens a page in a fresh tab. Use as a context manager."""

    def __init__(self, binary: str, timeout: float = 120.0) -> None:
        self.timeout, self._buffered, self._ids = timeout, b"", iter(range(1, 1_000_000))
        self._profile = tempfile.TemporaryDirectory(prefix="chromium-")
        to_chrome, self._out = os.pipe()
        self._in, from_chrome = os.pipe()
        to_chrome, from_chrome = _above_9(to_chrome), _above_9(from_chrome)
        # bash puts the pipe ends on fds 3 / 4 (no preexec_fn: no Python runs in the fork;
        # bash, not sh: dash refuses fd numbers above 9)
        command = " ".join(shlex.quote(part) for part in (
            binary, "--headless", "--remote-debugging-pipe", "--no-sandbox", "--disable-gpu",
            "--no-first-run", "--disable-extensions", "--hide-scrollbars",
            "--host-resolver-rules=MAP * ~NOTFOUND", f"--user-data-dir={self._profile.name}",
            "about:blank"))
        self._log = Path(self._profile.name) / "chromium.log"   # its stderr, for a failure
        with open(self._log, "wb") as log:
            self._proc = subprocess.Popen(
                ["bash", "-c", f"exec {command} 3<&{to_chrome} 4>&{from_chrome}"],
                pass_fds=(to_chrome, from_chrome), stdout=subprocess.DEVNULL, stderr=log)
        os.close(to_chrome)
        os.close(from_chrome)
        self.events: list[dict] = []

    def __enter__(self) -> Chromium:
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self._out)
        self._proc.kill()
        self._proc.wait(timeout=30)
        os.close(self._in)
        # its helper processes can still write the profile for a moment after the browser
        # process is gone ("Directory not empty: 'Default'"): retry, then leave what is left
        # to the test's own tmp folder
        for _ in range(20):
            try:
                self._profile.cleanup()
                return
            except OSError:
                time.sleep(0.25)

    def load(self, url: str, width: int, height: int, mobile: bool = False) -> BrowserRun:
        """`url` in a new tab of width x height CSS pixels: its screenshot, console errors,
        requests and document width once the load event has fired."""
        self.events = []
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target,
                                                      "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.send(f"{domain}.enable", session=session)
        self.send("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": mobile},
                  session=session)
        self.send("Page.navigate", {"url": url}, session=session)
        # the load event, then one round trip more so late console messages are in
        while not any(e.get("method") == "Page.loadEventFired" for e in self.events):
            self.send("Runtime.evaluate", {"expression": "1"}, session=session)
        scroll = self.send("Runtime.evaluate",
                           {"expression": "document.documentElement.scrollWidth",
                            "returnByValue": True}, session=session)
        shot = self.send("Page.captureScreenshot", {"format": "png"}, session=session)
        self.send("Target.closeTarget", {"targetId": target})
        return BrowserRun(base64.b64decode(shot["data"]),
                          [_console_text(e) for e in self.events if _is_error(e)],
                          [e["params"]["request"]["url"] for e in self.events
                           if e.get("method") == "Network.requestWillBeSent"],
                          int(scroll["result"]["value"]))

    def send(self, method: str, params: dict | None = None, session: str | None = None) -> dict:
        """One DevTools command's result; the events that arrive meanwhile go to self.events."""
        ident = next(self._ids)
        message = {"id": ident, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._out, json.dumps(message).encode() + b"\0")
        while True:
            while b"\0" not in self._buffered:
                ready, _, _ = select.select([self._in], [], [], self.timeout)
                chunk = os.read(self._in, 1 << 20) if ready else b""
                assert chunk, (f"chromium did not answer {method} within {self.timeout} s "
                               f"(exit {self._proc.poll()}): {self._log.read_text()[-3000:]}")
                self._buffered += chunk
            raw, self._buffered = self._buffered.split(b"\0", 1)
            reply = json.loads(raw)
            if reply.get("id") == ident:
                assert "error" not in reply, reply
                return reply.get("result", {})
            self.events.append(reply)


def _above_9(fd: int) -> int:
    """`fd` moved above 9, so bash's `3<&N 4>&M` never overwrites one end with the other."""
    high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
    os.close(fd)
    return high


def _is_error(event: dict) -> bool:
    method, params = event.get("method"), event.get("params", {})
    return (method == "Runtime.exceptionThrown"
            or (method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"))
            or (method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error"))


def _console_text(event: dict) -> str:
    return json.dumps(event.get("params"))[:500]


def pixel_spread(png: bytes) -> float:
    """Standard deviation of the screenshot's grey levels: ~0 for a blank page."""
    import numpy as np
    from PIL import Image

    return float(np.asarray(Image.open(io.BytesIO(png)).convert("L"), dtype=np.float32).std())


def save_small_png(png: bytes, path: Path, limit: int = 250_000) -> int:
    """The screenshot, optimised, at 256 colours if it is over `limit` bytes (docs/ screenshots
    stay small); its size in bytes."""
    from PIL import Image

    image = Image.open(io.BytesIO(png)).convert("RGB")
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path, format="PNG", optimize=True)
    if path.stat().st_size > limit:
        image.quantize(colors=256, method=Image.Quantize.FASTOCTREE).save(path, format="PNG",
                                                                          optimize=True)
    return path.stat().st_size

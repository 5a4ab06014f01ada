"""A headless Chromium driven over its DevTools protocol (CDP, one page, a websocket), for
scripts/ui_screenshots.py: open a URL, wait until the page's text holds what it should (a
single-page app renders after its API calls answer), scroll an element into view, take a
PNG of the viewport.

Not here: clicks, forms, more than one page, or any browser but Chromium's `--headless=new`.
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import time
import urllib.request
from pathlib import Path

from websockets.sync.client import connect


class BrowserError(Exception):
    """Chromium did not start, a command failed, or a page never showed what it should."""


class HeadlessPage:
    """One page of a headless Chromium started for it; close() ends Chromium."""

    def __init__(self, chromium: str, profile: Path, width: int, height: int, start_timeout_s: float = 120) -> None:
        sandbox = ["--no-sandbox"] if os.geteuid() == 0 else []  # Chromium's sandbox refuses root
        profile.mkdir(parents=True, exist_ok=True)
        self._log = profile / "chromium.log"
        with open(self._log, "w") as log:  # a file, not a pipe: nothing blocks when no one reads it
            self._process = subprocess.Popen(
                [chromium, "--headless=new", *sandbox, "--disable-gpu", "--hide-scrollbars", "--no-first-run",
                 "--remote-debugging-port=0", f"--user-data-dir={profile}", f"--window-size={width},{height}",
                 "about:blank"],
                stdout=subprocess.DEVNULL, stderr=log)
        try:
            port = self._devtools_port(start_timeout_s)
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=30) as answer:
                targets = [target for target in json.load(answer) if target.get("type") == "page"]
            if not targets:
                raise BrowserError("Chromium started with no page")
            self._socket = connect(targets[0]["webSocketDebuggerUrl"], max_size=None, open_timeout=60)
            self._next_id = 0
            self.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)
        except BaseException as exc:
            self._process.kill()
            self._process.wait()
            if isinstance(exc, OSError):  # the DevTools endpoint refused or timed out
                raise BrowserError(f"could not connect to Chromium's DevTools: {exc}") from None
            raise

    def _devtools_port(self, timeout_s: float) -> int:
        """The port of Chromium's stderr line `DevTools listening on ws://...:PORT/...`."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self._process.poll() is None:
            found = re.search(r"DevTools listening on ws://[^:]+:(\d+)/", self._log.read_text(errors="replace"))
            if found:
                return int(found.group(1))
            time.sleep(0.2)
        raise BrowserError(f"Chromium did not open its DevTools port (exit code {self._process.poll()}); see {self._log}")

    def call(self, method: str, timeout_s: float = 600, **params: object) -> dict:
        """Send one CDP command; its result (events in between are skipped). The timeout is
        a hang guard: on a machine at load 100 a screenshot took minutes."""
        self._next_id += 1
        self._socket.send(json.dumps({"id": self._next_id, "method": method, "params": params}))
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                message = json.loads(self._socket.recv(timeout=max(1.0, deadline - time.monotonic())))
            except TimeoutError:
                raise BrowserError(f"Chromium did not answer {method} within {timeout_s:.0f} s") from None
            if message.get("id") == self._next_id:
                if "error" in message:
                    raise BrowserError(f"{method}: {message['error'].get('message')}")
                return message.get("result", {})

    def evaluate(self, expression: str) -> object:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            raise BrowserError(f"script failed in the page: {details.get('exception', {}).get('description') or details.get('text')}")
        return result.get("result", {}).get("value")

    def open(self, url: str, expected: tuple[str, ...], timeout_s: float) -> None:
        """Navigate, then wait until the page's text holds every expected string and has
        stopped changing."""
        self.call("Page.navigate", url=url)
        self.settle(timeout_s, expected)

    def settle(self, timeout_s: float, expected: tuple[str, ...] = ()) -> None:
        """Poll the page's text until it holds every expected string and two reads a second
        apart are equal (its API calls answered, its lists rendered)."""
        deadline = time.monotonic() + timeout_s
        previous = None
        while True:
            text = str(self.evaluate("document.body ? document.body.innerText : ''"))
            missing = [wanted for wanted in expected if wanted not in text]
            if not missing and text == previous:
                return
            if time.monotonic() > deadline:
                raise BrowserError(f"{self.evaluate('location.href')} did not show {missing or 'a settled page'} "
                                   f"within {timeout_s:.0f} s (it shows: {' '.join(text.split())[:300]!r})")
            previous = text
            time.sleep(1.0)

    def scroll_to(self, text: str, block: str = "start") -> None:
        """Scroll the innermost element whose own text starts with `text` into view
        (`block`: start, center, end, as Element.scrollIntoView takes it)."""
        self.evaluate(self._innermost(text) + ".scrollIntoView({block: " + json.dumps(block) + "})")

    @staticmethod
    def _innermost(text: str) -> str:
        """A JS expression: the first innermost element whose text starts with `text` (it throws if none)."""
        return ("(() => { const all = [...document.querySelectorAll('body *')].filter(e => e.innerText && "
                "e.innerText.trim().startsWith(" + json.dumps(text) + "));"
                " const inner = all.filter(e => ![...e.children].some(c => all.includes(c)));"
                " if (!inner.length) throw new Error('no element with the text ' + " + json.dumps(json.dumps(text)) + ");"
                " return inner[0]; })()")

    def has(self, selector: str) -> bool:
        """Whether an element matches `selector` now."""
        return bool(self.evaluate(f"!!document.querySelector({json.dumps(selector)})"))

    def click(self, selector: str) -> None:
        """Click the first element `selector` matches (as a user's click: its handlers run)."""
        self.evaluate(f"(e => {{ if (!e) throw new Error('no element matches ' + {json.dumps(json.dumps(selector))});"
                      f" e.click(); }})(document.querySelector({json.dumps(selector)}))")

    def box_of(self, text: str) -> tuple[int, int, int, int]:
        """The viewport box (left, top, right, bottom) of the innermost element whose text starts with `text`."""
        return self._box(self._innermost(text))

    def box_of_selector(self, selector: str) -> tuple[int, int, int, int]:
        """The viewport box (left, top, right, bottom) of the first element `selector` matches."""
        return self._box(f"(e => {{ if (!e) throw new Error('no element matches ' + {json.dumps(json.dumps(selector))});"
                         f" return e; }})(document.querySelector({json.dumps(selector)}))")

    def _box(self, element: str) -> tuple[int, int, int, int]:
        left, top, right, bottom = self.evaluate(f"(r => [r.left, r.top, r.right, r.bottom])({element}.getBoundingClientRect())")  # type: ignore[misc]
        return int(left), int(top), int(right), int(bottom)

    def screenshot(self) -> bytes:
        """A PNG of the viewport."""
        return base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"])

    def close(self) -> None:
        try:
            self._socket.close()
        finally:
            self._process.terminate()
            try:
                self._process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()

"""A small client of Chromium's DevTools protocol, over the pipe it opens with `--remote-debugging-pipe`
(fd 3 in, fd 4 out, each message JSON ended by a NUL byte): no port, no websocket, no package.

    with Browser.start() as browser:
        page = browser.new_page(1280, 900)
        page.open("file:///tmp/report.html")
        page.evaluate("document.title")
        page.screenshot(Path("shot.png"))
        page.requests, page.errors   # every URL the page asked for; console errors and exceptions
        page.evaluate("document.title", frame="/report?")  # inside a frame of another origin

Frames of another origin (a sandboxed iframe among them) run in processes of their own: the page
attaches to each as it appears (`Target.setAutoAttach`), so its requests, errors and dialogs count
as the page's and `evaluate(..., frame=...)` reaches its document.

The browser runs headless with a fresh profile, no GPU, no background networking, and a host
resolver that resolves nothing but localhost, so a page cannot reach another machine.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import queue
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "chrome")
TIMEOUT_S = 30.0
"""Longest wait for one reply or a page load: a loaded CI machine starts Chromium in seconds."""


def _high_pipe() -> tuple[int, int]:
    """A pipe whose two ends are numbered 10 or more: the browser's ends are renumbered 3 and 4,
    which must not be the numbers of the ends themselves."""
    ends = []
    for end in os.pipe():
        ends.append(fcntl.fcntl(end, fcntl.F_DUPFD_CLOEXEC, 10))
        os.close(end)
    return ends[0], ends[1]


def chromium_path() -> str | None:
    """The Chromium executable on PATH, or None."""
    return next((found for name in CHROMIUM_NAMES if (found := shutil.which(name))), None)


class Browser:
    """One headless Chromium, driven through its DevTools pipe."""

    def __init__(self, executable: str) -> None:
        self._profile = tempfile.mkdtemp(prefix="trainprof-chromium-")
        to_browser_read, self._to_browser = _high_pipe()
        self._from_browser, from_browser_write = _high_pipe()
        flags = [
            "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run", "--no-default-browser-check",
            "--disable-extensions", "--mute-audio", "--hide-scrollbars",
            "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE localhost, EXCLUDE 127.0.0.1",
            f"--user-data-dir={self._profile}", "--remote-debugging-pipe", "about:blank",
        ]
        # The pipe's ends become the browser's fd 3 and 4: bash renumbers them (dash takes one-digit
        # numbers only, and the ends are 10 or more).
        script = f'exec "$0" "$@" 3<&{to_browser_read} 4>&{from_browser_write}'
        self._process = subprocess.Popen(
            ["bash", "-c", script, executable, *flags],
            pass_fds=(to_browser_read, from_browser_write),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(to_browser_read)
        os.close(from_browser_write)
        self._next_id = 0
        self._lock = threading.Lock()
        self._replies: dict[int, queue.Queue] = {}
        self._events: dict[str, list[dict]] = {}  # session id -> events
        self._unawaited: set[int] = set()  # ids of commands sent by `_post`
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    @classmethod
    def start(cls) -> Browser:
        """Start the Chromium on PATH (RuntimeError when there is none)."""
        executable = chromium_path()
        if executable is None:
            raise RuntimeError("no chromium on PATH")
        return cls(executable)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _read(self) -> None:
        buffer = b""
        while True:
            chunk = os.read(self._from_browser, 1 << 16)
            if not chunk:
                return
            buffer += chunk
            *messages, buffer = buffer.split(b"\0")
            for raw in messages:
                message = json.loads(raw)
                if "id" in message:
                    if message["id"] not in self._unawaited:
                        self._replies.setdefault(message["id"], queue.Queue()).put(message)
                else:
                    with self._lock:
                        self._events.setdefault(message.get("sessionId", ""), []).append(message)
                    if message["method"] == "Target.attachedToTarget":
                        self._watch_frame(message["params"]["sessionId"])

    def send(self, method: str, params: dict | None = None, session: str | None = None) -> dict:
        """Send one command and wait for its result (RuntimeError on a protocol error)."""
        with self._lock:
            self._next_id += 1
            message_id = self._next_id
            self._replies[message_id] = queue.Queue()
        message: dict[str, Any] = {"id": message_id, "method": method, "params": params or {}}
        if session is not None:
            message["sessionId"] = session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        reply = self._replies[message_id].get(timeout=TIMEOUT_S)
        del self._replies[message_id]
        if "error" in reply:
            raise RuntimeError(f"{method}: {reply['error']}")
        return reply.get("result", {})

    def events(self, session: str) -> list[dict]:
        """The events received so far for a session."""
        with self._lock:
            return list(self._events.get(session, []))

    def new_page(self, width: int, height: int) -> Page:
        """A new tab of the given viewport, with the page, console, log and network domains on."""
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.send(f"{domain}.enable", session=session)
        self.send("Target.setAutoAttach", {"autoAttach": True, "waitForDebuggerOnStart": True,
                                           "flatten": True}, session)
        self.send("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False}, session)
        return Page(self, session, target)

    def _watch_frame(self, session: str) -> None:
        """A frame of another origin, attached paused (from the reader thread, so without waiting for
        replies): its console, log and network domains on, its own frames attached, then it runs.
        Nothing it does before is lost."""
        for domain in ("Page", "Runtime", "Log", "Network"):
            self._post(f"{domain}.enable", {}, session)
        self._post("Target.setAutoAttach", {"autoAttach": True, "waitForDebuggerOnStart": True,
                                            "flatten": True}, session)
        self._post("Runtime.runIfWaitingForDebugger", {}, session)

    def _post(self, method: str, params: dict, session: str) -> None:
        """Send one command whose reply nobody waits for."""
        with self._lock:
            self._next_id += 1
            self._unawaited.add(self._next_id)
            message = {"id": self._next_id, "method": method, "params": params, "sessionId": session}
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")

    def close(self) -> None:
        """End the browser and remove its profile."""
        try:
            self.send("Browser.close")
        except Exception:  # already gone
            pass
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        os.close(self._to_browser)
        shutil.rmtree(self._profile, ignore_errors=True)


class Page:
    """One tab: open a URL, evaluate JavaScript, take screenshots, read what it requested and logged."""

    def __init__(self, browser: Browser, session: str, target: str) -> None:
        self.browser, self.session, self.target = browser, session, target

    def send(self, method: str, params: dict | None = None) -> dict:
        """A command to this tab."""
        return self.browser.send(method, params, self.session)

    def frames(self) -> dict[str, str]:
        """The frames of other origins attached now, their own frames' included, oldest first:
        session id -> the frame's URL now (a frame that navigated to another origin is a new one)."""
        found: dict[str, str] = {}
        sessions = [self.session]
        while sessions:
            events = self.browser.events(sessions.pop())
            gone = {e["params"]["sessionId"] for e in events if e["method"] == "Target.detachedFromTarget"}
            for event in events:
                if event["method"] != "Target.attachedToTarget" or event["params"]["sessionId"] in gone:
                    continue
                session, target = event["params"]["sessionId"], event["params"]["targetInfo"]["targetId"]
                try:
                    info = self.browser.send("Target.getTargetInfo", {"targetId": target})["targetInfo"]
                except RuntimeError:  # gone meanwhile
                    continue
                found[session] = info["url"]
                sessions.append(session)
        return found

    def _sessions(self) -> list[str]:
        return [self.session, *self.frames()]

    def open(self, url: str) -> None:
        """Navigate and wait for the load event."""
        seen = len(self.browser.events(self.session))
        self.send("Page.navigate", {"url": url})
        self.wait_for(lambda: any(e["method"] == "Page.loadEventFired"
                                  for e in self.browser.events(self.session)[seen:]), "the page's load event")

    def wait_for(self, condition, what: str, timeout_s: float = TIMEOUT_S) -> None:
        """Poll `condition()` until it is true (AssertionError naming `what` after `timeout_s`)."""
        deadline = time.monotonic() + timeout_s
        while not condition():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}")
            time.sleep(0.05)

    def evaluate(self, expression: str, frame: str | None = None) -> Any:
        """The value of a JavaScript expression (promises awaited), or AssertionError on an exception.
        `frame`: in the attached frame of another origin whose URL holds this text (AssertionError
        while there is none)."""
        session = self.session
        if frame is not None:  # the newest such frame
            session = next((s for s, url in reversed(self.frames().items()) if frame in url), None)
            if session is None:
                raise AssertionError(f"no frame of another origin at a URL holding {frame!r}")
        try:
            result = self.browser.send("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                            "awaitPromise": True}, session)
        except RuntimeError as error:  # the frame went away (navigated) while it evaluated
            raise AssertionError(f"{expression[:80]}: {error}") from error
        if "exceptionDetails" in result:
            raise AssertionError(f"{expression[:80]}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def screenshot(self, path: Path) -> Path:
        """The whole page, beyond the viewport, as a PNG."""
        data = self.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True})["data"]
        path.write_bytes(base64.b64decode(data))
        return path

    @property
    def requests(self) -> list[str]:
        """Every URL the tab requested (documents, scripts, styles, fonts, images, fetches)."""
        return [e["params"]["request"]["url"] for e in self._events()
                if e["method"] == "Network.requestWillBeSent"]

    def _events(self) -> list[dict]:
        """The events of the tab and of the frames of other origins it attached."""
        return [event for session in self._sessions() for event in self.browser.events(session)]

    @property
    def errors(self) -> list[str]:
        """Console errors, uncaught exceptions and error log entries (failed loads, CSP refusals)."""
        found = []
        for event in self._events():
            method, params = event["method"], event.get("params", {})
            if method == "Runtime.exceptionThrown":
                found.append(json.dumps(params["exceptionDetails"])[:500])
            elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                found.append(" ".join(str(a.get("value", a.get("description", ""))) for a in params["args"]))
            elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
                found.append(f"{params['entry'].get('source')}: {params['entry'].get('text')} "
                             f"{params['entry'].get('url', '')}")
        return found

    @property
    def dialogs(self) -> list[str]:
        """The messages of every alert/confirm/prompt the page opened."""
        return [e["params"].get("message", "") for e in self._events()
                if e["method"] == "Page.javascriptDialogOpening"]

"""A real headless Chromium (Debian's ``chromium``) driven over the DevTools protocol, for the page tests.

No driver, no downloaded browser and no websocket library: Chromium is started with
``--remote-debugging-pipe`` and reads protocol commands from its fd 3 and writes replies and events to its fd 4,
each message a JSON object ended by a NUL byte. It runs in its own process group with its profile and HOME under
the test's directory (its TMPDIR is a short new dir in the system temp dir, removed again); ``close()`` ends it
(Browser.close, then SIGKILL of the group) and reports any process of the group still alive, so a test can assert
that nothing was left behind.

    with Chromium(tmp_path / "chromium") as browser:
        page = browser.open(url)             # a new tab; waits for its load event
        page.eval("document.title")          # Runtime.evaluate, value returned
        page.screenshot(tmp_path / "x.png")  # the whole page
        page.requests()                      # every URL the tab asked for (Network.requestWillBeSent)
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-default-apps", "--disable-extensions", "--mute-audio", "--hide-scrollbars",
         "--no-default-browser-check", "--password-store=basic", "--use-mock-keychain",
         "--remote-debugging-pipe"]


def chromium_binary() -> str:
    """Debian's ``chromium`` (scripts/test.sh installs it); a clear error when it is missing."""
    found = shutil.which("chromium")
    if found is None:
        raise RuntimeError("the 'chromium' command is not installed: apt-get install -y chromium "
                           "(scripts/test.sh does it)")
    return found


class ProtocolError(RuntimeError):
    pass


class Chromium:
    def __init__(self, workdir: Path, width: int = 1280, height: int = 900, offline: bool = True) -> None:
        """``offline``: no host name resolves but 127.0.0.1 and localhost, as on a host without internet."""
        self.workdir = Path(workdir)
        self.offline = offline
        self.width, self.height = width, height
        self.proc: subprocess.Popen[bytes] | None = None
        self.leftovers: list[tuple[int, str]] = []
        self._next_id = 0
        self._replies: dict[int, dict[str, Any]] = {}
        self._events: list[dict[str, Any]] = []
        self._cond = threading.Condition()
        self._closed = False
        self._closed_pipe = False

    # -- lifecycle ---------------------------------------------------------------------------
    def __enter__(self) -> "Chromium":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        for sub in ("profile", "home"):
            (self.workdir / sub).mkdir(parents=True, exist_ok=True)
        # Chromium's singleton socket lives in TMPDIR and a socket path has at most 107 bytes: a short temp dir,
        # removed by close()
        self._tmp = Path(tempfile.mkdtemp(prefix="chromium-"))
        cmd_r, self._cmd_w = os.pipe()   # we write commands; Chromium reads them on its fd 3
        self._evt_r, evt_w = os.pipe()   # Chromium writes on its fd 4; we read
        # the child's ends moved to fds >= 100, so that putting them on 3 and 4 can overwrite neither
        cmd_r, evt_w = _high(cmd_r), _high(evt_w)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.workdir / "home"),
               "TMPDIR": str(self._tmp), "LANG": "C.UTF-8",
               "XDG_CONFIG_HOME": str(self.workdir / "home"), "XDG_CACHE_HOME": str(self.workdir / "home")}
        args = [chromium_binary(), *FLAGS, f"--user-data-dir={self.workdir / 'profile'}",
                f"--window-size={self.width},{self.height}",
                *(["--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1, EXCLUDE localhost"] if self.offline
                  else []), "about:blank"]
        # bash puts the pipe ends on fds 3 and 4, then becomes Chromium (same pid, same process group)
        with open(self.workdir / "chromium.log", "wb") as log:
            self.proc = subprocess.Popen(["bash", "-c", f'exec "$@" 3<&{cmd_r} 4>&{evt_w} {cmd_r}<&- {evt_w}>&-',
                                          "chromium", *args],
                                         pass_fds=(cmd_r, evt_w), env=env, start_new_session=True,
                                         stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        os.close(cmd_r)
        os.close(evt_w)
        threading.Thread(target=self._read, name="cdp-reader", daemon=True).start()
        self.call("Browser.getVersion")  # answers once the browser is up

    def close(self) -> None:
        """Close the browser, SIGKILL what is left of its process group and record it in ``leftovers``."""
        if self.proc is None or self._closed:
            return
        self._closed = True
        try:
            self.call("Browser.close", timeout=5)
        except (ProtocolError, TimeoutError, OSError):
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            pass
        pgid = self.proc.pid
        deadline = time.monotonic() + 5
        self.leftovers = group_members(pgid)
        while self.leftovers and time.monotonic() < deadline:
            time.sleep(0.1)
            self.leftovers = group_members(pgid)
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if self.proc.poll() is None:
            self.proc.wait(5)
        try:
            os.close(self._cmd_w)
        except OSError:
            pass
        shutil.rmtree(self._tmp, ignore_errors=True)

    # -- protocol ------------------------------------------------------------------------------
    def _read(self) -> None:
        buf = b""
        while True:
            try:
                chunk = os.read(self._evt_r, 1 << 20)
            except OSError:
                chunk = b""
            if not chunk:
                break
            buf += chunk
            while b"\0" in buf:
                raw, buf = buf.split(b"\0", 1)
                msg = json.loads(raw)
                with self._cond:
                    if "id" in msg:
                        self._replies[msg["id"]] = msg
                    else:
                        self._events.append(msg)
                    self._cond.notify_all()
        os.close(self._evt_r)
        with self._cond:
            self._closed_pipe = True
            self._cond.notify_all()

    def call(self, method: str, params: dict[str, Any] | None = None, session: str | None = None,
             timeout: float = 30.0) -> dict[str, Any]:
        with self._cond:
            self._next_id += 1
            mid = self._next_id
        msg: dict[str, Any] = {"id": mid, "method": method, "params": params or {}}
        if session is not None:
            msg["sessionId"] = session
        os.write(self._cmd_w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        with self._cond:
            while mid not in self._replies:
                left = deadline - time.monotonic()
                if left <= 0 or self._closed_pipe:
                    raise TimeoutError(f"no reply to {method} within {timeout} s" +
                                       ("" if self.proc is None or self.proc.poll() is None else
                                        f": chromium exited with {self.proc.returncode}, "
                                        f"see {self.workdir}/chromium.log"))
                self._cond.wait(min(left, 0.5))
            reply = self._replies.pop(mid)
        if "error" in reply:
            raise ProtocolError(f"{method}: {reply['error']}")
        return dict(reply.get("result", {}))

    def events(self, method: str, session: str | None = None) -> list[dict[str, Any]]:
        with self._cond:
            return [e["params"] for e in self._events
                    if e.get("method") == method and (session is None or e.get("sessionId") == session)]

    def wait_event(self, method: str, session: str | None, after: int, timeout: float = 30.0) -> dict[str, Any]:
        """The first ``method`` event of ``session`` among events number ``after`` and later."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for e in self._events[after:]:
                    if e.get("method") == method and e.get("sessionId") == session:
                        return dict(e["params"])
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no {method} event within {timeout} s")
                self._cond.wait(left)

    def event_count(self) -> int:
        with self._cond:
            return len(self._events)

    # -- pages ---------------------------------------------------------------------------------
    def open(self, url: str, timeout: float = 30.0) -> "Page":
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        page = Page(self, session)
        for domain in ("Page", "Network", "Runtime", "Log"):
            self.call(f"{domain}.enable", session=session)
        self.call("Emulation.setDeviceMetricsOverride", {"width": self.width, "height": self.height,
                                                         "deviceScaleFactor": 1, "mobile": False}, session)
        page.navigate(url, timeout)
        return page


class Page:
    def __init__(self, browser: Chromium, session: str) -> None:
        self.browser, self.session = browser, session

    def navigate(self, url: str, timeout: float = 30.0) -> None:
        mark = self.mark()
        got = self.browser.call("Page.navigate", {"url": url}, self.session)
        if got.get("errorText"):
            raise ProtocolError(f"navigating to {url}: {got['errorText']}")
        self.wait_load(mark, timeout)

    def mark(self) -> int:
        """A point in the event log, for ``wait_load``."""
        return self.browser.event_count()

    def wait_load(self, mark: int, timeout: float = 30.0) -> None:
        """Wait for a load of this tab after ``mark`` (the page reloading itself, say)."""
        self.browser.wait_event("Page.loadEventFired", self.session, mark, timeout)

    def eval(self, expression: str, timeout: float = 30.0) -> Any:
        """The value of a JavaScript expression in the page (promises awaited); errors raise."""
        got = self.browser.call("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                     "awaitPromise": True}, self.session, timeout)
        if "exceptionDetails" in got:
            raise ProtocolError(f"{expression[:80]}: {got['exceptionDetails']}")
        return got["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 30.0) -> Any:
        """Poll ``expression`` until it is truthy (scripts of the page may still be rendering)."""
        deadline = time.monotonic() + timeout
        while True:
            got = self.eval(expression)
            if got:
                return got
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{expression[:80]} stayed falsy for {timeout} s")
            time.sleep(0.1)

    def screenshot(self, path: Path) -> Path:
        """A PNG of the whole page (not just the viewport)."""
        size = self.browser.call("Page.getLayoutMetrics", session=self.session)["cssContentSize"]
        clip = {"x": 0, "y": 0, "width": max(1, size["width"]), "height": max(1, size["height"]), "scale": 1}
        data = self.browser.call("Page.captureScreenshot", {"format": "png", "clip": clip,
                                                            "captureBeyondViewport": True}, self.session)["data"]
        path.write_bytes(base64.b64decode(data))
        return path

    def requests(self) -> list[str]:
        """Every URL this tab requested (documents, scripts, styles, images, fetches)."""
        return [e["request"]["url"] for e in self.browser.events("Network.requestWillBeSent", self.session)]

    def failed_requests(self) -> list[str]:
        return [e.get("errorText", "") for e in self.browser.events("Network.loadingFailed", self.session)]

    def console(self) -> list[str]:
        """Console and browser log lines of this tab (CSP violations show here)."""
        out = [f"{e['entry'].get('level')}: {e['entry'].get('text')}"
               for e in self.browser.events("Log.entryAdded", self.session)]
        for e in self.browser.events("Runtime.consoleAPICalled", self.session):
            out.append(f"{e.get('type')}: " + " ".join(str(a.get("value", a.get("description", "")))
                                                      for a in e.get("args", [])))
        for e in self.browser.events("Runtime.exceptionThrown", self.session):
            out.append(f"exception: {e['exceptionDetails'].get('text')}")
        return out


def _high(fd: int) -> int:
    """``fd`` moved to a number >= 100 (the old one closed)."""
    high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 100)
    os.close(fd)
    return high


def group_members(pgid: int) -> list[tuple[int, str]]:
    """Live (not zombie) processes of process group ``pgid``: (pid, command)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            raw = stat.read_text()
        except OSError:
            continue
        end = raw.rfind(")")
        fields = raw[end + 2:].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            found.append((int(stat.parent.name), raw[raw.find("(") + 1:end]))
    return found

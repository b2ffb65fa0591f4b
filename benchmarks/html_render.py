"""The HTML report in numbers and in a real browser.

- ``python -m benchmarks.html_render``: the time to render a Llama-2-70B-shaped report (80 layers,
  shape-only on ``meta``, every operator record, the roofline estimate) as a page, its size,
  and, when Debian's ``chromium`` is installed, the time the browser takes to draw it and to zoom
  the icicle; one JSON line.
- ``python -m benchmarks.html_render --against REV``: also the same page drawn by git revision
  ``REV``'s script, both loaded in turn in one browser (medians of 5): a change to the script
  measured side by side.
- ``python -m benchmarks.html_render --screenshots docs``: the pictures for the README (resnet50
  with ``--hardware h100-sxm --memory``; a small Llama-style decoder; a plan on 8 GPUs).

:class:`Chromium` drives headless Chromium through the DevTools protocol over a pipe
(``--remote-debugging-pipe``: no port, no Python package, no downloaded browser); the browser
test tier (``tests/render_html/test_browser.py``) uses it too.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import fcntl
import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import Any

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "chrome")


def chromium_path() -> str | None:
    """The browser to drive: ``$FLOPSCOPE_CHROMIUM``, else the first of :data:`CHROMIUM_NAMES`
    on the PATH, else ``None``."""
    given = os.environ.get("FLOPSCOPE_CHROMIUM")
    if given:
        return given
    return next((p for p in map(shutil.which, CHROMIUM_NAMES) if p), None)


class Chromium:
    """Headless Chromium with the network off, spoken to over ``--remote-debugging-pipe``
    (file descriptors 3 and 4 of the browser, NUL-separated JSON messages).

    Use as a context manager; :meth:`open` loads a page and collects its console errors,
    uncaught exceptions and network requests.

    Args:
        exe: the browser (default: :func:`chromium_path`).
        width: the window's width in CSS pixels.
        height: the window's height.
        timeout: seconds to wait for any one answer.
    """

    def __init__(self, exe: str | None = None, *, width: int = 1300, height: int = 1600,
                 timeout: float = 60.0) -> None:
        exe = exe or chromium_path()
        if exe is None:
            raise RuntimeError("no chromium found: apt-get install chromium")
        self.width, self.height, self.timeout = width, height, timeout
        self.profile = tempfile.TemporaryDirectory(prefix="flopscope-chromium-")
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()

        def fds() -> None:  # in the child: the protocol's fds 3 (commands) and 4 (answers)
            a = fcntl.fcntl(to_browser_r, fcntl.F_DUPFD, 10)
            b = fcntl.fcntl(from_browser_w, fcntl.F_DUPFD, 10)
            os.dup2(a, 3)
            os.dup2(b, 4)

        self.proc = subprocess.Popen(
            [exe, "--headless=new", "--disable-gpu", "--no-sandbox", "--remote-debugging-pipe",
             f"--user-data-dir={self.profile.name}", "--no-first-run", "--no-default-browser-check",
             "--disable-extensions", "--disable-background-networking", "--disable-sync",
             "--disable-component-update", "--disable-default-apps", "--hide-scrollbars",
             "--mute-audio", f"--window-size={width},{height}", "about:blank"],
            preexec_fn=fds, close_fds=False, stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._answers: queue.Queue[dict[str, Any]] = queue.Queue()
        self.events: list[dict[str, Any]] = []
        self._next = 0
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.session: str | None = None

    def _read(self) -> None:
        buf = b""
        while True:
            chunk = os.read(self._from_browser, 1 << 16)
            if not chunk:
                return
            buf += chunk
            while b"\0" in buf:
                msg, buf = buf.split(b"\0", 1)
                self._answers.put(json.loads(msg))

    def send(self, method: str, params: dict[str, Any] | None = None, *,
             session: bool = True) -> dict[str, Any]:
        """One protocol command; its result (events that arrive meanwhile go to :attr:`events`).

        Raises:
            RuntimeError: the browser answered with an error, or not in time.
        """
        self._next += 1
        msg: dict[str, Any] = {"id": self._next, "method": method, "params": params or {}}
        if session and self.session:
            msg["sessionId"] = self.session
        os.write(self._to_browser, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        while True:
            answer = self._answers.get(timeout=max(deadline - time.monotonic(), 0.01))
            if answer.get("id") == self._next:
                if "error" in answer:
                    raise RuntimeError(f"{method}: {answer['error']}")
                return answer.get("result", {})
            self.events.append(answer)

    def wait_for(self, method: str) -> dict[str, Any]:
        """The next event ``method`` (or one already seen since the last :meth:`open`)."""
        for ev in self.events:
            if ev.get("method") == method:
                return ev
        deadline = time.monotonic() + self.timeout
        while True:
            ev = self._answers.get(timeout=max(deadline - time.monotonic(), 0.01))
            self.events.append(ev)
            if ev.get("method") == method:
                return ev

    def open(self, path: Path) -> None:
        """Load a file with the network off; wait for its load event."""
        target = self.send("Target.createTarget", {"url": "about:blank"}, session=False)
        attached = self.send("Target.attachToTarget",
                             {"targetId": target["targetId"], "flatten": True}, session=False)
        self.session = attached["sessionId"]
        for domain in ("Runtime", "Log", "Page", "Network"):
            self.send(f"{domain}.enable")
        self.send("Network.emulateNetworkConditions",
                  {"offline": True, "latency": 0, "downloadThroughput": -1,
                   "uploadThroughput": -1})
        self.send("Emulation.setDeviceMetricsOverride",
                  {"width": self.width, "height": self.height, "deviceScaleFactor": 1,
                   "mobile": False})
        self.events.clear()
        self.send("Page.navigate", {"url": Path(path).resolve().as_uri()})
        self.wait_for("Page.loadEventFired")

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (promises awaited).

        Raises:
            RuntimeError: the expression threw.
        """
        out = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                             "awaitPromise": True})
        if "exceptionDetails" in out:
            raise RuntimeError(f"{expression[:60]}: {out['exceptionDetails']}")
        return out["result"].get("value")

    def click(self, selector: str) -> None:
        """A real mouse click (pressed and released) near the left of the element, scrolled
        into view first."""
        box = self.evaluate(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)}); "
            "e.scrollIntoView({block: 'center'}); const r = e.getBoundingClientRect(); "
            "return [r.left + Math.min(r.width / 2, 20), r.top + r.height / 2]; })()")
        for kind in ("mousePressed", "mouseReleased"):
            self.send("Input.dispatchMouseEvent", {"type": kind, "x": box[0], "y": box[1],
                                                   "button": "left", "clickCount": 1})

    def errors(self) -> list[str]:
        """Console errors, uncaught exceptions and error log entries since the page opened."""
        out = []
        for ev in self.events:
            method, params = ev.get("method"), ev.get("params", {})
            if method == "Runtime.exceptionThrown":
                out.append(str(params["exceptionDetails"]))
            elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                out.append(" ".join(str(a.get("value", a.get("description"))) for a in params["args"]))
            elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
                out.append(params["entry"]["text"])
        return out

    def requests(self) -> list[str]:
        """Every URL the page asked for since it opened (the page's own file included)."""
        return [ev["params"]["request"]["url"] for ev in self.events
                if ev.get("method") == "Network.requestWillBeSent"]

    def screenshot(self, path: Path, *, height: int | None = None) -> None:
        """A PNG of the page's top ``height`` pixels (default: the window)."""
        clip = {"x": 0, "y": 0, "width": self.width, "height": height or self.height, "scale": 1}
        shot = self.send("Page.captureScreenshot", {"format": "png", "clip": clip,
                                                    "captureBeyondViewport": True})
        Path(path).write_bytes(base64.b64decode(shot["data"]))

    def close(self) -> None:
        """End the browser."""
        with contextlib.suppress(RuntimeError, OSError, queue.Empty):
            self.send("Browser.close", session=False)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._to_browser)
        self.profile.cleanup()

    def __enter__(self) -> Chromium:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


# -- the reports --------------------------------------------------------------------------------
LLAMA_70B_LAYERS = 80


def llama_70b_report(tokens: int = 2048, hardware: str = "h100-sxm") -> Any:
    """A Llama-2-70B-shaped decoder (``benchmarks.scale.LLAMA_70B``) counted shape-only on
    ``meta`` with the roofline estimate: every operator record of 80 layers."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    from benchmarks.scale import LLAMA_70B
    from flopscope.estimate import roofline

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(LlamaConfig(**LLAMA_70B)).eval()
        ids = torch.zeros(1, tokens, dtype=torch.long)
    return roofline(model, ids, hardware=hardware, warn=False).report


def small_llama_page(path: Path) -> None:
    """The page of a small Llama-style decoder (4 layers) with the estimate and memory."""
    from flopscope.cli import main

    code = main(["count", "hf:llama", "--shape-only", "--config", "num_hidden_layers=4",
                 "--config", "hidden_size=512", "--config", "intermediate_size=1408",
                 "--config", "num_attention_heads=8", "--config", "num_key_value_heads=2",
                 "--seq-len", "512", "--hardware", "h100-sxm", "--memory", "--format", "html",
                 "--output", str(path)])
    if code:
        raise SystemExit(code)


def resnet50_page(path: Path) -> None:
    """The page of ``flopscope count torchvision:resnet50 --hardware h100-sxm --memory``."""
    from flopscope.cli import main

    code = main(["count", "torchvision:resnet50", "--hardware", "h100-sxm", "--memory",
                 "--format", "html", "--output", str(path)])
    if code:
        raise SystemExit(code)


# the plan pictured in docs/html_plan.png: an 8-layer Llama-style decoder on 8 H100s
PLAN_ARGS = ("hf:llama", "--gpus", "8", "--hardware", "h100-sxm", "--seq-len", "1024",
             "--global-batch", "16", "--memory-budget", "2GiB", "--config", "num_hidden_layers=8",
             "--config", "hidden_size=1024", "--config", "intermediate_size=2816",
             "--config", "num_attention_heads=16", "--config", "num_key_value_heads=8",
             "--config", "vocab_size=32000")


def plan_page(path: Path) -> None:
    """The page of ``flopscope plan`` :data:`PLAN_ARGS` (about 3 CPU-minutes)."""
    from flopscope.cli import main

    code = main(["plan", *PLAN_ARGS, "--format", "html", "--output", str(path)])
    if code:
        raise SystemExit(code)


def render_seconds(report: Any, repeats: int = 5) -> tuple[float, str]:
    """The fastest of ``repeats`` renderings of ``report`` as a page, and the page."""
    from flopscope.render.html import render_html

    best, text = float("inf"), ""
    for _ in range(repeats):
        start = time.perf_counter()
        text = render_html(report)
        best = min(best, time.perf_counter() - start)
    return best, text


_ZOOM = """(() => {
  const svg = document.querySelector('#icicle');
  const node = svg.querySelector('g.node[data-path="model.layers"]') ||
               svg.querySelectorAll('g.node')[1];
  const t0 = performance.now();
  node.dispatchEvent(new MouseEvent('click', {bubbles: true}));
  return [performance.now() - t0, svg.getAttribute('data-focus')];
})()"""


def browser_timing(path: Path) -> dict[str, Any]:
    """How long Chromium takes to load and draw the page, and to zoom its icicle."""
    with Chromium() as browser:
        start = time.perf_counter()
        browser.open(path)
        loaded = time.perf_counter() - start
        ready = browser.evaluate("document.getElementById('flopscope').dataset.ready")
        nav = browser.evaluate("performance.getEntriesByType('navigation')[0].loadEventEnd")
        zoom_ms, focus = browser.evaluate(_ZOOM)
        return {"browser_load_s": loaded, "load_event_ms": nav, "ready": ready == "1",
                "zoom_ms": zoom_ms, "zoomed_to": focus, "errors": browser.errors()}


def page_with_script_of(text: str, rev: str) -> str:
    """``text`` (a page) drawn by the page script of git revision ``rev`` instead (its assets
    joined as :func:`flopscope.render.html._script` joins the current ones): the same data, the
    other script, to time the two side by side."""
    folder = "src/flopscope/render/html_assets"
    names = subprocess.run(["git", "ls-tree", "--name-only", f"{rev}:{folder}"], check=True,
                           capture_output=True, text=True).stdout.split()
    order = [n for n in ("widgets.js", "report.js", "plan.js", "pages.js") if n in names]
    old = '(function () {\n  "use strict";\n' + "".join(
        subprocess.run(["git", "show", f"{rev}:{folder}/{n}"], check=True, capture_output=True,
                       text=True).stdout for n in order) + "})();\n"
    start = text.rindex("<script>\n") + len("<script>\n")  # the page's own script, last
    return text[:start] + old + text[text.rindex("</script>"):]


def side_by_side(text: str, rev: str, rounds: int = 5) -> dict[str, Any]:
    """The page drawn by this tree's script and by ``rev``'s, loaded in turn ``rounds`` times in
    one browser: the median load-event time and icicle zoom of each."""
    import statistics

    loads: dict[str, list[float]] = {"this": [], rev: []}
    zooms: dict[str, list[float]] = {"this": [], rev: []}
    with tempfile.TemporaryDirectory() as tmp, Chromium() as browser:
        pages = {"this": Path(tmp) / "this.html", rev: Path(tmp) / "rev.html"}
        pages["this"].write_text(text, encoding="utf-8")
        pages[rev].write_text(page_with_script_of(text, rev), encoding="utf-8")
        for _ in range(rounds):
            for key, page in pages.items():
                browser.open(page)
                if browser.evaluate("document.getElementById('flopscope').dataset.ready") != "1":
                    raise RuntimeError(f"{key}: the page was not drawn: {browser.errors()}")
                loads[key].append(browser.evaluate(
                    "performance.getEntriesByType('navigation')[0].loadEventEnd"))
                zooms[key].append(browser.evaluate(_ZOOM)[0])
    return {f"{k}_{what}": statistics.median(v) for what, table in (("load_event_ms", loads),
                                                                    ("zoom_ms", zooms))
            for k, v in table.items()}


def screenshots(folder: Path) -> list[Path]:
    """docs/html_resnet50.png, docs/html_llama.png and docs/html_plan.png: the top of each
    page."""
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, make in (("resnet50", resnet50_page), ("llama", small_llama_page),
                           ("plan", plan_page)):
            page = Path(tmp) / f"{name}.html"
            make(page)
            png = folder / f"html_{name}.png"
            with Chromium(width=1280, height=1500) as browser:
                browser.open(page)
                browser.screenshot(png)
            out.append(png)
    return out


def main(argv: list[str] | None = None) -> int:
    """Measure (default) or write the screenshots."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.html_render")
    parser.add_argument("--screenshots", metavar="DIR", help="write the README's pictures here")
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--against", metavar="REV",
                        help="also time the page drawn by git revision REV's script, in turn")
    args = parser.parse_args(argv)
    if args.screenshots:
        for png in screenshots(Path(args.screenshots)):
            print(f"wrote {png}", file=sys.stderr)
        return 0
    start = time.perf_counter()
    report = llama_70b_report(args.tokens)
    counted = time.perf_counter() - start
    seconds, text = render_seconds(report)
    row: dict[str, Any] = {"model": f"Llama-2-70B-shaped, {LLAMA_70B_LAYERS} layers, "
                                    f"{args.tokens} tokens, shape-only, --hardware h100-sxm",
                           "count_s": counted, "records": len(report.records),
                           "modules": len(report.modules), "render_s": seconds,
                           "page_bytes": len(text.encode("utf-8"))}
    if chromium_path():
        with tempfile.TemporaryDirectory() as tmp:
            page = Path(tmp) / "llama70b.html"
            page.write_text(text, encoding="utf-8")
            row.update(browser_timing(page))
        if args.against:
            row["against"] = args.against
            row.update(side_by_side(text, args.against))
    print(json.dumps(row))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

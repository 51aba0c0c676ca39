"""`navrl-daemon report` on a short real run, opened in a real headless Chromium.

The browser is driven over the DevTools protocol on a pipe (`--remote-debugging-pipe`:
NUL-terminated JSON on fds 3 and 4), so no extra library is needed. A control page with a
broken image and a console error shows the checks can fail.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import select
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from navrl_daemon.cli import main
from tests.conftest import TINY, navrl_cli

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
RUN = [
    *TINY,
    "log.summary_interval=2",
    "run.total_frames=768",  # 12 iterations of 64 frames
    "eval.interval=4",
    "checkpoint.interval=4",
]


def require_chromium() -> str:
    """Chromium's path; without it skip here, but fail in CI (.ci/run installs it)."""
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path:
        return path
    if os.environ.get("CI"):
        pytest.fail("chromium not found on PATH; CI must have it (.ci/run installs chromium)")
    pytest.skip("chromium not installed (Debian: apt-get install chromium); CI does not skip")


class Chromium:
    """A headless Chromium and one page, spoken to over the DevTools pipe."""

    def __init__(self, binary: str, profile: Path) -> None:
        cmd_r, self._cmd_w = os.pipe()
        self._out_r, out_w = os.pipe()

        def wire_pipes() -> None:  # in the child: the protocol's fixed fds 3 and 4
            os.dup2(cmd_r, 3)
            os.dup2(out_w, 4)

        self.proc = subprocess.Popen(
            [
                binary,
                "--headless",
                "--no-sandbox",  # CI runs as root
                "--disable-gpu",
                "--no-first-run",
                "--no-default-browser-check",
                "--remote-debugging-pipe",
                f"--user-data-dir={profile}",
                "--window-size=1280,1024",
                "about:blank",
            ],
            preexec_fn=wire_pipes,
            pass_fds=(3, 4),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(cmd_r)
        os.close(out_w)
        self._buf = b""
        self._id = 0
        self.events: list[dict[str, Any]] = []
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        attached = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})
        self.session = attached["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.send(f"{domain}.enable", page=True)

    def send(self, method: str, params: dict | None = None, *, page: bool = False) -> Any:
        self._id += 1
        msg: dict[str, Any] = {"id": self._id, "method": method, "params": params or {}}
        if page:
            msg["sessionId"] = self.session
        os.write(self._cmd_w, json.dumps(msg).encode() + b"\0")
        while True:
            reply = self._read()
            if reply.get("id") == self._id:
                assert "error" not in reply, (method, reply["error"])
                return reply["result"]
            self.events.append(reply)

    def open(self, page: Path) -> dict[str, Any]:
        """Load `page`; what the checks need: its images, console errors, requests, a
        full-page screenshot."""
        self.events.clear()
        self.send("Page.navigate", {"url": page.as_uri()}, page=True)
        while not any(e.get("method") == "Page.loadEventFired" for e in self.events):
            self.events.append(self._read())
        images = self.send(
            "Runtime.evaluate",
            {
                "expression": "JSON.stringify(Array.from(document.images,"
                " i => ({complete: i.complete, width: i.naturalWidth})))",
                "returnByValue": True,
            },
            page=True,
        )["result"]["value"]
        shot = self.send(
            "Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True}, page=True
        )
        return {
            "images": json.loads(images),
            "errors": [_describe(e) for e in self.events if _is_error(e)],
            "requests": [
                e["params"]["request"]["url"]
                for e in self.events
                if e.get("method") == "Network.requestWillBeSent"
            ],
            "screenshot": base64.b64decode(shot["data"]),
        }

    def close(self) -> None:
        with contextlib.suppress(OSError, AssertionError, EOFError, TimeoutError):
            self.send("Browser.close")
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._cmd_w)
        os.close(self._out_r)

    def _read(self, timeout: float = 60) -> dict[str, Any]:
        while b"\0" not in self._buf:
            ready, _, _ = select.select([self._out_r], [], [], timeout)
            if not ready:
                raise TimeoutError("chromium sent nothing for 60 s")
            chunk = os.read(self._out_r, 1 << 20)
            if not chunk:
                raise EOFError(f"chromium closed the pipe (exit {self.proc.poll()})")
            self._buf += chunk
        msg, self._buf = self._buf.split(b"\0", 1)
        return json.loads(msg)


def _is_error(event: dict[str, Any]) -> bool:
    method, params = event.get("method"), event.get("params", {})
    if method == "Runtime.exceptionThrown":
        return True
    if method == "Runtime.consoleAPICalled":
        return params.get("type") in ("error", "assert")
    if method == "Log.entryAdded":
        return params.get("entry", {}).get("level") == "error"
    return False


def _describe(event: dict[str, Any]) -> str:
    return json.dumps(event.get("params", {}))[:300]


@pytest.fixture(scope="module")
def chromium(tmp_path_factory: pytest.TempPathFactory) -> Any:
    browser = Chromium(require_chromium(), tmp_path_factory.mktemp("chromium-profile"))
    yield browser
    browser.close()


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A state dir after a short real run: history, evaluations, checkpoints."""
    state = tmp_path_factory.mktemp("report-run") / "state"
    done = navrl_cli("run", "--state-dir", str(state), *RUN, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    return state


def test_report_of_a_real_run_loads_in_chromium(
    run_dir: Path, chromium: Chromium, tmp_path: Path
) -> None:
    out = tmp_path / "report"
    done = navrl_cli("report", "--state-dir", str(run_dir), "--out", str(out), "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    doc = json.loads(done.stdout)
    assert doc["report"] == str(out / "report.html")
    assert doc["history_rows"] == 6 and doc["problems"] == []
    # The evaluator's channel coalesces: a slow evaluation skips versions, so the count is
    # what the run wrote (of versions 1, 4, 8 and 12; a stop drops one in flight).
    written = (run_dir / "eval" / "results.jsonl").read_text().splitlines()
    assert 1 <= doc["evaluations"] == len(written) <= 4
    assert str(out / "trajectories.png") in doc["images"]

    page = chromium.open(out / "report.html")
    (tmp_path / "screenshot.png").write_bytes(page["screenshot"])
    assert page["screenshot"].startswith(PNG_SIGNATURE) and len(page["screenshot"]) > 10_000
    # 5 learning-curve images (the update's statistics other than losses and gradient norms
    # in update.png), the trajectory plot and the episode video (an animated GIF), every one
    # decoded by the browser.
    assert len(page["images"]) == 7, page["images"]
    assert str(out / "update.png") in doc["images"]
    assert str(out / "episodes.gif") in doc["images"]
    # The run has moving obstacles (TINY's 8): the captions say what the purple is.
    assert "moving obstacles in purple" in (out / "report.html").read_text()
    assert all(img["complete"] and img["width"] > 0 for img in page["images"]), page["images"]
    assert page["errors"] == []
    # Self-contained: nothing but the file itself and its data: images was requested.
    assert all(url.startswith(("file:", "data:")) for url in page["requests"]), page["requests"]
    html = (out / "report.html").read_text()
    assert "ckpt-000000012.nrc" in html and "best evaluation" in html
    assert "[ppo]" in html  # the run's config.toml


def test_chromium_checks_catch_a_broken_page(chromium: Chromium, tmp_path: Path) -> None:
    """The control: the same checks on a page with a broken image and a console error."""
    page = tmp_path / "broken.html"
    page.write_text(
        '<!DOCTYPE html><html><head><link rel="icon" href="data:,"></head><body>'
        '<img src="data:image/png;base64,AAAA"><script>console.error("boom")</script>'
        "</body></html>"
    )
    seen = chromium.open(page)
    assert [img["width"] for img in seen["images"]] == [0]
    assert any("boom" in e for e in seen["errors"]), seen["errors"]


def report(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """The command in this process (fast); no exception may escape it."""
    code = main(["report", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_report_names_a_corrupt_history_line_and_uses_the_others(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "state"
    shutil.copytree(run_dir, state, ignore=shutil.ignore_patterns("report"))
    lines = (state / "history.jsonl").read_text().splitlines(keepends=True)
    lines[2] = '{"iteration": 6, "frames": 38\n'  # torn in the middle of the file
    (state / "history.jsonl").write_text("".join(lines))
    code, out, err = report(capsys, "--state-dir", str(state), "--no-trajectories", "--json")
    assert code == 65, err
    assert f"{state / 'history.jsonl'}:3: not JSON" in err
    doc = json.loads(out)
    assert doc["history_rows"] == 5  # the other rows are still drawn
    html = (state / "report" / "report.html").read_text()
    assert "history.jsonl:3" in html  # and the page says which line was skipped


@pytest.mark.parametrize("case", ["missing", "empty"])
def test_report_on_a_missing_or_empty_state_dir(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "state"
    if case == "empty":
        state.mkdir()
    code, _, err = report(capsys, "--state-dir", str(state))
    assert code == 65, err
    assert err.startswith(f"navrl-daemon: error: {state}: no ") and "nothing to report" in err
    assert not (state / "report").exists()


def test_report_says_it_replays_an_evaluation(run_dir: Path, tmp_path: Path) -> None:
    """The replay for the paths takes an evaluation's time (a minute at NavRL's scale on
    a CPU): `report` says what it does meanwhile, and how to skip it."""
    done = navrl_cli("report", "--state-dir", str(run_dir), "--out", str(tmp_path / "r"))
    assert done.returncode == 0, done.stderr[-2000:]
    assert "report: replaying ckpt-" in done.stderr and "--no-trajectories" in done.stderr

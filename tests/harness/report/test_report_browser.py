"""The report in a real headless Chromium: it renders, logs no console message, requests nothing
over the network (Chromium's own net log is the witness), and screenshots to a PNG.

Skipped, with the reason, where no Chromium is installed (`apt-get install chromium-headless-shell`
on Debian provides one)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from harness.report.page import write_report
from tests.harness.report.runs import plan_run, revalidate_run, serve_load_trace_run, unknown_run

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "chromium-headless-shell")
BROWSER = next((b for b in map(shutil.which, BROWSERS) if b), None)
pytestmark = pytest.mark.skipif(BROWSER is None, reason=f"no headless Chromium on PATH (looked for {', '.join(BROWSERS)})")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--enable-logging=stderr", "--v=0"]


def chromium(*args: str) -> subprocess.CompletedProcess[str]:
    assert BROWSER is not None
    return subprocess.run([BROWSER, *FLAGS, *args], capture_output=True, text=True, timeout=120, check=False)


def test_report_renders_in_headless_chromium(tmp_path: Path) -> None:
    runs = [serve_load_trace_run(tmp_path / "trace-run"), revalidate_run(tmp_path / "reval"),
            plan_run(tmp_path / "plan"), unknown_run(tmp_path / "odd")]  # fmt: skip
    page = tmp_path / "report.html"
    write_report(runs, page)
    net = tmp_path / "net.json"
    dom = chromium(f"--log-net-log={net}", "--dump-dom", page.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert "trace: 4/4 answered" in dom.stdout and dom.stdout.count("<section") == 4
    assert not [ln for ln in dom.stderr.splitlines() if ":CONSOLE" in ln]  # no console output at all
    fetched = set(re.findall(r'"url":"([^"]+)"', net.read_text()))
    assert not fetched, fetched  # nothing but the file itself was read
    shot = tmp_path / "report.png"
    res = chromium(f"--screenshot={shot}", "--window-size=1400,2000", page.as_uri())
    assert res.returncode == 0 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_net_log_would_see_a_fetch(tmp_path: Path) -> None:
    """The witness works: a page that loads an image from a (closed) loopback port shows it."""
    page = tmp_path / "bad.html"
    page.write_text('<!DOCTYPE html><img src="http://127.0.0.1:9/x.png"><script>console.error("x")</script>')
    net = tmp_path / "net.json"
    res = chromium(f"--log-net-log={net}", "--dump-dom", page.as_uri())
    assert "http://127.0.0.1:9/x.png" in net.read_text()
    assert any(":CONSOLE" in ln for ln in res.stderr.splitlines())

"""`g4bench report`: every kind gets a view, the page is self-contained, the CLI writes it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from harness.report.page import ReportError, check_self_contained, render, write_report
from harness.report.views import collect
from tests.harness.report.runs import plan_run, revalidate_run, serve_load_trace_run, unknown_run


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("runs")
    return [serve_load_trace_run(root / "trace-run"), revalidate_run(root / "reval"), plan_run(root / "plan"),
            unknown_run(root / "odd"), serve_load_trace_run(root / "no-plots", plots=False)]  # fmt: skip


def test_each_kind_has_its_verdict(runs: list[Path]) -> None:
    trace, reval, plan, odd, bare = (collect(p) for p in runs)
    assert trace.kind == "serve-load" and trace.verdict.startswith("trace: 4/4 answered; schedule fidelity p50")
    assert ("server /metrics", "unavailable: /metrics answered HTTP 404") in trace.facts
    assert dict(trace.facts)["server cached"].startswith("64.0%")  # 3 × 512 of 2,400 prompt tokens
    assert reval.kind == "revalidate" and reval.verdict == "verdicts: faster 1; host quiet: yes"
    assert reval.device == "cpu" and reval.tables[0].rows[0][-1] == "faster"
    assert plan.kind == "plan" and "58/chip" in plan.verdict
    assert odd.kind == "unknown" and odd.command == "g4bench something-new --flag"
    assert [t.title for t in odd.tables] == ["summary.csv"] and len(odd.figures) == 1
    assert bare.figures and any("drawn for this report" in n for n in bare.notes)  # redrawn without plots/


def test_page_is_self_contained(runs: list[Path], tmp_path: Path) -> None:
    views = write_report(runs, tmp_path / "r.html")
    html = (tmp_path / "r.html").read_text()
    assert not re.search(r"""(?:src|href)\s*=\s*["']?\s*(?:https?:)?//""", html, re.IGNORECASE)
    assert "<script" not in html.lower() and "<link" not in html.lower() and "@import" not in html
    imgs = re.findall(r'<img src="([^"]+)"', html)
    assert len(imgs) == sum(len(v.figures) for v in views) and all(s.startswith("data:image/") for s in imgs)
    assert "http://127.0.0.1:9" in html  # the command line and server are shown, as text only
    for v in views:
        assert v.name in html
    assert "grid-template-columns: repeat(3," in html  # side by side, three to a row


@pytest.mark.parametrize("bad", [
    '<img src="https://example.com/a.png">', "<img src='//cdn.example.com/a.png'>", '<a href="http://x">x</a>',
    '<link rel="stylesheet" href="s.css">', "<script>1</script>", "<style>body{background:url(http://x/a.png)}</style>",
    "<style>@import 'x.css';</style>", '<div style="background: url(a.png)"></div>', '<img src="file:///etc/x.png">',
])  # fmt: skip
def test_the_guard_refuses_anything_that_fetches(bad: str) -> None:
    with pytest.raises(ReportError):
        check_self_contained(f"<html><body>{bad}</body></html>")


def test_the_guard_lets_text_and_data_uris_through() -> None:
    check_self_contained('<p>--url https://example.com src=http://x</p><img src="data:image/png;base64,AAAA">'
                         "<style>a{color:red}</style>")  # fmt: skip


def test_a_missing_or_empty_folder_is_a_view_not_a_crash(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "results.jsonl").write_text('{"kind": "revalidate"}\nnot json\n')
    views = [collect(tmp_path / "empty"), collect(tmp_path / "broken")]
    assert views[0].kind == "unknown" and "results.jsonl: unreadable" in views[1].notes[0]
    check_self_contained(render(views))


def test_cli(runs: list[Path], tmp_path: Path) -> None:
    from g4bench.cli import app

    out = tmp_path / "page.html"
    res = CliRunner().invoke(app, ["report", *map(str, runs[:2]), "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert out.is_file() and "trace: 4/4 answered" in res.output
    res = CliRunner().invoke(app, ["report", str(tmp_path / "nope"), "--out", str(out)])
    assert res.exit_code == 2 and "not a folder" in res.output

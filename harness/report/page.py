"""Render `RunView`s into one HTML page that needs nothing beside it.

    html = render([collect(d) for d in run_dirs])

The page is templates/report.html.jinja (jinja2, autoescaped): an overview with one column per run
(kind, command, device, revision, verdict), then each run's section — side by side for up to three
runs — with its facts, tables and figures. Figures are inline data URIs, the CSS is inline, and
there is no script; `check_self_contained` refuses a page that would load anything (a src, href,
CSS url() or @import pointing at a network or file location), so the file opens the same offline,
mailed, or years later.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Sequence
from pathlib import Path

from harness.report.views import RunView

TEMPLATES = Path(__file__).resolve().parent / "templates"
_TAG = re.compile(r"<[a-zA-Z][^>]*>")
_STYLE = re.compile(r"<style[^>]*>(.*?)</style>", re.IGNORECASE | re.DOTALL)
# inside a tag: an element that loads things, or an attribute naming a scheme or a // location
_FETCHING_TAG = re.compile(r"^<(?:script|link|iframe|object|embed|base)\b", re.IGNORECASE)
_FETCHING_ATTR = re.compile(
    r"""\b(?:src|href|srcset|action|poster|data|background)\s*=\s*["']?\s*(?:(?!data:)[a-z][a-z0-9+.-]*:|//)""",
    re.IGNORECASE,
)
_FETCHING_CSS = re.compile(r"""url\(\s*["']?\s*(?!data:)|@import""", re.IGNORECASE)


class ReportError(ValueError):
    """The page would not be self-contained."""


def check_self_contained(html: str) -> None:
    """Raise `ReportError` if a tag or the CSS of `html` would fetch anything (text is escaped, so
    only markup can)."""
    for tag in _TAG.findall(html):
        if _FETCHING_TAG.match(tag) or _FETCHING_ATTR.search(tag):
            raise ReportError(f"the page would load an external resource: {tag[:120]!r}")
    inline_css = [m.group(0) for tag in _TAG.findall(html) if (m := re.search(r"style\s*=\s*\"[^\"]*\"", tag))]
    for css in _STYLE.findall(html) + inline_css:
        if m := _FETCHING_CSS.search(css):
            raise ReportError(f"the page's CSS would load an external resource near {css[m.start() : m.end() + 60]!r}")


def render(views: Sequence[RunView], title: str = "g4bench report") -> str:
    import jinja2

    from harness.env import host_env

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)  # fmt: skip
    page = env.get_template("report.html.jinja").render(
        title=title,
        views=views,
        columns=min(len(views), 3),
        generated=dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        version=host_env({}).get("g4bench_version") or "?",
    )
    check_self_contained(page)
    return page


def write_report(run_dirs: Sequence[Path], out: Path, title: str = "g4bench report") -> list[RunView]:
    """Collect every run folder, render, write `out`; returns the views (for the command's summary)."""
    from harness.report.views import collect

    views = [collect(Path(d)) for d in run_dirs]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render(views, title), encoding="utf-8")
    return views

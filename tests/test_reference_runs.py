"""The committed reference runs stay curated: few, small, named for what they show, each explained.

`results/reference/` keeps only runs that a test, the gate, a profile, the README or
docs/findings.md cites (results/reference/README.md); everything else lives in git history.
These checks read the tree as committed, so a run dropped in by hand fails here, not in review.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "results" / "reference"
MAX_FOLDERS = 20
MAX_BYTES = 12 * 1024**2
# names of work periods or sessions ("…-s12-1", "session15"): history belongs in git, not in names
WORK_PERIOD = re.compile(r"(^|[-_])(s\d+|session\d*|day\d+|sprint\d*)([-_]|$)", re.IGNORECASE)


def _folders() -> list[Path]:
    return sorted(p for p in REFERENCE.iterdir() if p.is_dir())


def test_reference_runs_are_few_and_small():
    folders = _folders()
    assert len(folders) <= MAX_FOLDERS, [p.name for p in folders]
    size = sum(f.stat().st_size for f in REFERENCE.rglob("*") if f.is_file())
    assert size <= MAX_BYTES, f"results/reference holds {size / 1024**2:.1f} MB (at most {MAX_BYTES / 1024**2:.0f})"


def test_no_path_is_named_after_a_work_period():
    named = [str(p.relative_to(REFERENCE)) for p in REFERENCE.rglob("*") if WORK_PERIOD.search(p.name)]
    assert named == []


def test_every_folder_says_its_claim_command_and_device_and_is_in_the_index():
    index = (REFERENCE / "README.md").read_text()
    listed = set(re.findall(r"\]\(([^)/]+)/\)", index))
    folders = {p.name for p in _folders()}
    assert listed == folders, {"not in the index": folders - listed, "listed but absent": listed - folders}
    for name in sorted(folders):
        text = (REFERENCE / name / "README.md").read_text()
        missing = [w for w in ("claim", "command", "device") if w not in text.lower()]
        assert missing == [], f"{name}/README.md does not say its {', '.join(missing)}"


def test_readme_first_screen_shows_an_answer():
    """The README's first screen carries real output (a code block) and its links into the
    reference runs name folders that exist."""
    readme = (ROOT / "README.md").read_text()
    first_screen = "\n".join(readme.splitlines()[:60])
    assert "```" in first_screen
    cited = set(re.findall(r"results/reference/([a-z0-9][\w.-]*)", readme))  # NAME is a placeholder
    absent = sorted(c for c in cited if not (REFERENCE / c).exists())
    assert absent == []

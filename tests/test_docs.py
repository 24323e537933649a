"""The docs hold together: every relative link names a file and heading that exist, and dated measurements live
only in the dated pages (docs/results-*.md), so the reference pages say how things work, not what one day measured."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")
DATE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    return {slug(line.lstrip("#")) for line in text.splitlines() if line.startswith("#")}


def links(page: Path) -> list[str]:
    return [m for m in LINK.findall(FENCE.sub("", page.read_text())) if "://" not in m and not m.startswith("mailto:")]


def test_slug_is_githubs():
    assert slug(" P9: HTTP ÷ in-process (benchmarks/serve.py)") == "p9-http--in-process-benchmarksservepy"
    assert slug(" `corescale serve` and `--bundle`") == "corescale-serve-and---bundle"


def test_every_relative_link_names_a_file_and_heading_that_exist():
    broken = []
    for page in PAGES:
        for target in links(page):
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            if not file.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and file.suffix == ".md" and anchor not in anchors(file):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_dated_figures_only_in_the_dated_pages():
    dated = []
    for page in PAGES:
        if page.name.startswith("results-") or page.name == "README.md":
            continue
        for number, line in enumerate(FENCE.sub("", page.read_text()).splitlines(), 1):
            if DATE.search(LINK.sub("]", line)):
                dated.append(f"{page.relative_to(ROOT)}:{number}: {line.strip()[:90]}")
    assert not dated, "dated figures belong in docs/results-*.md:\n" + "\n".join(dated)

"""The report read in a real browser (headless Chromium) at a laptop's width and at a phone's: nothing wider than
the window (wide tables and figures scroll inside their own box), no empty chart box, every image and chart
drawn, the sections in the order a reader asks, and no two texts of a chart drawn over each other. Built from a
real tune's results (tests/data/tune1) and a plain sweep's (tests/data/schema1); screenshots of both widths go
to the session's screenshots folder (conftest.py)."""

import tempfile

import pytest
from helpers import ROOT
from test_report import CHROMIUM, CHROMIUM_FLAGS

from corescale.report import html as report

pytestmark = pytest.mark.slow  # starts a browser

DATA = ROOT / "tests" / "data"
WIDTHS = {"laptop": (1366, 768), "phone": (390, 844)}

# elements wider than the window, outside a box that scrolls on its own (plotly's text-measuring svg is parked
# off-screen on purpose)
TOO_WIDE = """() => Array.from(document.querySelectorAll("body *")).filter(el => {
  if (el.closest(".scroll, .frame, pre, #js-plotly-tester")) { return false; }
  const r = el.getBoundingClientRect();
  return r.width > 0 && (r.right > window.innerWidth + 1 || r.left < -1);
}).map(el => el.tagName + "#" + el.id + "." + el.getAttribute("class"))"""
# every text a plotly chart draws (ticks, axis titles, legend, annotations), hover and mode bar left out
CHART_TEXTS = """div => Array.from(div.querySelectorAll(".main-svg text, .main-svg .annotation-text-g")).filter(t => {
  if (t.closest(".hoverlayer, .modebar") || t.closest(".annotation") && !t.matches(".annotation-text-g")) {
    return false;
  }
  const r = t.getBoundingClientRect();
  return r.width > 0 && r.height > 0 && getComputedStyle(t).visibility !== "hidden" && t.textContent.trim();
}).map(t => { const r = t.getBoundingClientRect();
              return [t.textContent.trim(), r.left, r.top, r.right, r.bottom]; })"""


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    out = tmp_path_factory.mktemp("reports")
    return {name: report.build(DATA / name, out / f"{name}.html") for name in ("tune1", "schema1")}


def _overlapping(texts) -> list[tuple[str, str]]:
    return [(a[0], b[0]) for i, a in enumerate(texts) for b in texts[i + 1:]
            if min(a[3], b[3]) - max(a[1], b[1]) > 1 and min(a[4], b[4]) - max(a[2], b[2]) > 1]


def _in_order(ids: list[str]) -> bool:
    known = [i for i in ids if i in report.ORDER]
    return known == sorted(known, key=report.ORDER.index)


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("name", ["tune1", "schema1"])
def test_the_report_reads_at_a_laptops_and_a_phones_width(reports, name, width, screenshots):
    from playwright import sync_api

    built = reports[name]
    problems: list[str] = []
    w, h = WIDTHS[width]
    with sync_api.sync_playwright() as playwright, tempfile.TemporaryDirectory() as profile:
        browser = playwright.chromium.launch_persistent_context(profile, executable_path=CHROMIUM,
                                                                args=CHROMIUM_FLAGS, headless=True,
                                                                viewport={"width": w, "height": h})
        page = browser.new_page()
        page.on("console", lambda m: problems.append(f"{m.type}: {m.text}") if m.type in ("error", "warning")
                else None)
        page.on("pageerror", lambda error: problems.append(f"page error: {error}"))
        page.goto(built.path.as_uri())
        page.wait_for_load_state("load")
        page.wait_for_function("""() => Array.from(document.querySelectorAll(".js-plotly-plot")).every(
            d => d.getAttribute("data-labels-placed") === String(d._fullLayout.width))""")  # labels placed
        page.screenshot(path=str(screenshots / f"report-{name}-{width}.png"), full_page=True)
        body_width = page.evaluate("document.documentElement.scrollWidth")
        too_wide = page.evaluate(TOO_WIDE)
        text = page.inner_text("body")
        images = page.eval_on_selector_all("img", "imgs => imgs.map(i => [i.alt, i.complete, i.naturalWidth])")
        ids = page.eval_on_selector_all("main > section", "sections => sections.map(s => s.id)")
        chart_texts = {div: page.eval_on_selector(f"#{div}", CHART_TEXTS)
                       for div in page.eval_on_selector_all(".js-plotly-plot", "ds => ds.map(d => d.id)")}
        notes = page.eval_on_selector_all(".annotation", "ns => ns.filter(n => n.getBoundingClientRect().width > 0)"
                                          ".map(n => n.textContent)")
        browser.close()
    assert not problems, problems
    assert body_width <= w, f"the page scrolls sideways: {body_width} px in a {w} px window"
    assert too_wide == []
    assert "Not enough data" not in text
    assert images and all(complete and natural > 0 for _, complete, natural in images), images
    assert len(images) == len(built.charts)  # every figure drawn, none beside it empty
    assert ids[0] == "answer" and _in_order(ids), ids
    assert ids.index("cost") < ids.index("roofline" if "roofline" in ids else "environment") < ids.index("results")
    for div, texts in chart_texts.items():
        assert texts, div
        assert _overlapping(texts) == [], (div, _overlapping(texts))
    if name == "tune1":
        assert set(chart_texts) == {"tune-pareto", "tune-trials", "tune-importance"}
        assert ids[:2] == ["answer", "cost"] and "tuner" in ids and "not-measured" in ids
        assert "recommended" in notes  # the recommendation is labelled at both widths
        assert "cores scaling: corescale study cores model=bert-tiny" in text
    else:
        assert "tuner" not in ids and {"heatmap", "cores", "instances"} <= set(ids)


def test_the_sections_go_in_the_order_a_reader_asks():
    sections = [(sid, sid, "") for sid in ("results", "roofline", "quality", "a-new-one", "tuner", "cost",
                                           "answer", "not-measured", "explain")]
    ordered = [sid for sid, _, _ in report._ordered(sections)]
    assert ordered == ["answer", "quality", "cost", "explain", "roofline", "tuner", "a-new-one", "not-measured",
                       "results"]

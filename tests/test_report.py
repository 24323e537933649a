"""The HTML report: self-contained, every chart present, strings escaped, rendered in headless Chromium."""

import base64
import json
import re
import shutil
import tempfile
from pathlib import Path

import pytest
from helpers import FAST, corescale

from corescale.report.html import CHARTS

pytestmark = pytest.mark.slow  # every test here starts processes

CHROMIUM = "/usr/bin/chromium"
INJECTED = "<img src=x onerror=\"console.error('injected')\">&-model"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """Small sweeps that together feed every chart: batch × sequence grid, 1 and 2 cores, 1 and 2 instances
    (also a batch of 2 split over 2 instances), and a second backend."""
    out = tmp_path_factory.mktemp("report") / "outputs"
    fast = [*FAST, "duration=0.3", "warmup.max_iterations=3", f"output_dir={out}"]
    for sweep in (["batch_size=1,2", "sequence_length=16,32"],
                  ["sequence_length=16", "instances=1,2", "cores_per_instance=1"],
                  ["sequence_length=16", "backend=torchscript", "calibrate=true"]):  # roofs: the roofline chart
        proc = corescale("run", "-m", *fast, *sweep, "--no-progress")
        assert proc.returncode == 0, proc.stderr
    # a copy of one run under a hostile model name: it must show up escaped, never as markup
    # (copied from a pytorch run, so that `--where backend=torchscript` below sees one model, whatever the order)
    source = next(d for d in sorted(out.iterdir())
                  if json.loads((d / "result.json").read_text())["config"]["backend"]["name"] == "pytorch")
    copy = out / "injected-copy"
    shutil.copytree(source, copy)
    record = json.loads((copy / "result.json").read_text())
    record["config"]["model"] = INJECTED
    record["trial_key"] = "injected"
    (copy / "result.json").write_text(json.dumps(record))
    return out


@pytest.fixture(scope="module")
def report(root, tmp_path_factory):
    html_path = tmp_path_factory.mktemp("html") / "report.html"
    proc = corescale("report", str(root), "-o", str(html_path), "--slo-p99-ms", "1000")
    assert proc.returncode == 0, proc.stderr
    assert f"report: {html_path}" in proc.stdout and "charts without enough data" not in proc.stdout
    return html_path


def test_self_contained_with_pngs_beside_it(report):
    text = report.read_text()
    assert not re.search(r"https?://", text)  # nothing to fetch: no scripts, styles or images from a network
    assert "<script src" not in text and "<link" not in text
    for chart in CHARTS:
        png = report.with_name(f"report-{chart.id}.png").read_bytes()
        assert png.startswith(b"\x89PNG")
        assert f'id="chart-{chart.id}"' in text and base64.b64encode(png).decode() in text  # embedded, same bytes
    assert "Environment" in text and "All results (8)" in text and "US$ per 1M" in text


def test_strings_are_escaped(report):
    text = report.read_text()
    assert INJECTED not in text
    assert "&lt;img src=x onerror=&quot;console.error(&#x27;injected&#x27;)&quot;&gt;&amp;-model" in text


def test_renders_in_headless_chromium(report, screenshots):
    from playwright import sync_api  # pip install 'corescale[test]' (uses the system chromium, no download)

    assert Path(CHROMIUM).exists(), "chromium is missing: apt-get install -y chromium (see .ci/setup-system.sh)"
    problems, requests = [], []
    with sync_api.sync_playwright() as playwright, tempfile.TemporaryDirectory() as profile:
        browser = playwright.chromium.launch_persistent_context(profile, executable_path=CHROMIUM,
                                                                args=CHROMIUM_FLAGS, headless=True,
                                                                viewport={"width": 1400, "height": 1000})
        page = browser.new_page()
        page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type in (
            "error", "warning") else None)
        page.on("pageerror", lambda error: problems.append(f"page error: {error}"))
        page.on("request", lambda r: requests.append(r.url) if not r.url.startswith(("data:", "file:")) else None)
        page.goto(report.as_uri())
        page.wait_for_load_state("load")
        page.screenshot(path=str(screenshots / "report.png"), full_page=True)
        for chart in CHARTS:
            width = page.eval_on_selector(f"#chart-{chart.id} img", "img => img.naturalWidth")
            assert width > 300, f"chart {chart.id} did not render"
        assert page.locator("img[src='x']").count() == 0  # the hostile model name stayed text
        assert INJECTED in page.inner_text("#results-table")

        header = page.locator("#results-table th", has_text="p50 ms").first
        column = page.eval_on_selector_all("#results-table th", "ths => ths.map(t => t.textContent)").index("p50 ms")
        values = f"rows => rows.map(r => parseFloat(r.cells[{column}].getAttribute('data-value')))"
        header.click()
        ascending = page.eval_on_selector_all("#results-table tbody tr", values)
        header.click()
        descending = page.eval_on_selector_all("#results-table tbody tr", values)
        browser.close()
    assert ascending == sorted(ascending) and descending == sorted(ascending, reverse=True)
    assert not problems, problems
    assert not requests, requests


def test_missing_data_is_explained_not_fatal(root, tmp_path):
    html_path = tmp_path / "one.html"
    proc = corescale("report", str(root), "-o", str(html_path), "--where", "backend=torchscript")
    assert proc.returncode == 0, proc.stderr
    assert "charts without enough data: heatmap, cores, instances, batch, backends" in proc.stdout
    text = html_path.read_text()
    assert "Not enough data" not in text and text.count('id="not-measured-line"') == 1  # one line, no empty box
    for chart in ("heatmap", "cores", "instances", "batch", "backends"):
        assert f'id="chart-{chart}"' not in text and f'<section id="{chart}">' not in text
    assert "cores scaling: <code>corescale study cores model=bert-tiny</code>" in text
    assert html_path.with_name("one-cost.png").exists() and not html_path.with_name("one-cores.png").exists()


def test_report_of_empty_root_is_one_line(tmp_path):
    proc = corescale("report", str(tmp_path))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "no results under" in proc.stderr

"""The report of results whose strings were not written by corescale: model names, tune documents and explain
files holding markup (HTML, matplotlib's mathtext `$...$`, quotes, ampersands) are shown as text, never as markup,
and a malformed tune or explain document is skipped with a note while everything else is still written. Built
in this process from copies of recorded results."""

import json
import re
import shutil

import pytest
from helpers import ROOT

from corescale.cli import main
from corescale.explain.opclasses import ALL_CLASSES
from corescale.report import html as report

pytestmark = pytest.mark.slow  # chart rendering may start fc-list once (matplotlib's font cache on a cold machine)

SCHEMA1 = ROOT / "tests" / "data" / "schema1"
HOSTILE = ["<script>alert('m')</script>", "a$x^$b", "$\\frac{1}{0}$", "&amp; & \"q\" 'a'",
           "</script><img src=x onerror=alert(1)>", "m$"]
MARKUP = re.compile(r"<script>alert|<img src=x|<b>boom</b>")  # a tag, not its escaped text


def _hostile_root(tmp_path):
    """schema1's results, each run's model renamed to one hostile string (and one's CPU model too)."""
    root = tmp_path / "root"
    shutil.copytree(SCHEMA1, root)
    for number, result in enumerate(sorted(root.rglob("result.json"))):
        record = json.loads(result.read_text())
        record["config"]["model"] = HOSTILE[number % len(HOSTILE)]
        record["environment"]["cpu"]["model"] = "<b>boom</b> $cpu$"
        result.write_text(json.dumps(record))
    return root


def _explanation(label: str) -> dict:
    configuration = {"label": label, "model": label, "threads": 1, "batch_size": 1, "sequence_length": 32,
                     "latency_ms": 1.0, "classes_ms": {c: 0.1 for c in ALL_CLASSES},
                     "findings": [{"text": f"<b>boom</b> {label}", "evidence": {}}]}
    return {"kind": "explain", "profiling_run": True, "configurations": [configuration]}


def _tune_document(root):
    from corescale.tune.document import Figure, TunedFinalist, TuneDocument, TuneObjective, TuneTrial

    figure = Figure(10.0, 9.0, 11.0, 2)
    label = "backend=<img src=x onerror=alert(1)> $x$"
    winner = TunedFinalist(label, "winner", [label], False, [], 2, 1, True, False, figure, figure, figure,
                           Figure(), figure, Figure())
    trial = TuneTrial(0, "COMPLETE", {"backend": "<b>boom</b>"}, 10.0, label, [label], {"throughput": 10.0},
                      {"throughput": 11.0}, None, None, None, 1.0, 2.0)
    doc = TuneDocument("2026-12-02T06:00:00+0000", str(root), {"repeats": "<img src=x onerror=alert(1)>"}, {}, 4,
                       0.3, 0.6, 2, TuneObjective("throughput", "throughput", "maximize", "samples/s"), [trial],
                       [winner], None, [f"recommended: {label}"], importances={"<b>boom</b>": 1.0},
                       winner=label, recipe={"recipe.sh": "<b>boom</b>"})
    (root / "tune.json").write_text(json.dumps(doc.to_dict()))
    (root / "recipe").mkdir()
    (root / "recipe" / "recipe.sh").write_text("#!/bin/sh\necho '</pre><script>alert(1)</script>'\n")


def test_hostile_strings_are_text_in_the_report_and_its_charts(tmp_path):
    root = _hostile_root(tmp_path)
    _tune_document(root)
    (root / "explain").mkdir()
    for number, label in enumerate(HOSTILE):
        (root / "explain" / f"{number}.json").write_text(json.dumps(_explanation(label)))
    built = report.build(root, tmp_path / "report.html")  # mathtext in a chart would raise here
    text = built.path.read_text()
    assert built.charts and not built.skipped
    assert not MARKUP.search(text), MARKUP.search(text)
    assert "&lt;script&gt;alert(&#x27;m&#x27;)&lt;/script&gt;" in text and "a$x^$b" in text
    assert "&lt;b&gt;boom&lt;/b&gt;" in text  # the CPU model, the recipe path, findings
    assert "final repeats &lt;img src=x" in text
    assert "echo &#x27;&lt;/pre&gt;&lt;script&gt;" in text  # the recipe, read from the tune's directory
    for png in built.pngs:
        assert png.stat().st_size > 1000


BAD_DOCUMENTS = {
    "list.json": "[]", "no-configurations.json": '{"kind": "explain"}', "binary.json": "\0\1\2",
    "configurations-text.json": '{"kind": "explain", "configurations": "many"}',
    "label-missing.json": json.dumps({"kind": "explain", "configurations": [{"model": "m"}]}),
    "classes-wrong.json": json.dumps({"kind": "explain", "configurations": [{
        **_explanation("x")["configurations"][0], "classes_ms": {c: "slow" for c in ALL_CLASSES}}]}),
}


@pytest.mark.parametrize("tune_json", ["[]", '{"schema_version": 2}', '{"space_size": "<b>boom</b>"}', "\0"])
def test_malformed_documents_are_skipped_with_a_note(tmp_path, tune_json, capsys):
    root = tmp_path / "root"
    shutil.copytree(SCHEMA1, root)
    (root / "tune.json").write_text(tune_json)
    (root / "explain").mkdir()
    for name, content in BAD_DOCUMENTS.items():
        (root / "explain" / name).write_text(content)
    (root / "explain" / "good.json").write_text(json.dumps(_explanation("fine")))
    out = tmp_path / "report.html"
    assert main(["report", str(root), "-o", str(out)]) == 0
    err = capsys.readouterr().err
    text = out.read_text()
    assert "tune document" in err or "tune.json" in err
    for name in BAD_DOCUMENTS:
        assert name in err and name in text, name
    assert "Where the time goes" in text and "Skipped files" in text and not MARKUP.search(text)
    assert "Traceback" not in err

"""Derived ONNX artifacts on a cold cache: two instances that start together build each artifact once (under the
cache's lock, in a private temp dir, renamed into place) and both run on it. Through the real CLI, one fresh
cache per artifact kind: fusion-int8 takes the export's, the fusion's and the quantization's locks in one run
(ONNX Runtime's plain export on a cold cache by two instances: conftest.py's onnxruntime_runs,
test_backends_onnxruntime.py)."""

import pytest
from helpers import run_record

from corescale.backends.artifact_cache import LOCK_DIR, MANIFEST, damage

pytestmark = pytest.mark.slow  # every test here starts processes

KINDS = {
    "fusion-int8": ["backend=onnxruntime", "backend.fusion=true", "precision=int8"],
    "openvino": ["backend=openvino"],
}
STAGES = {"fusion-int8": ["export", "fuse", "quantize"], "openvino": ["export"]}


@pytest.mark.parametrize("kind", list(KINDS))
def test_two_instances_on_a_cold_cache(kind, tmp_path):
    cache = tmp_path / "cache"
    record = run_record(tmp_path / "out", *KINDS[kind], "instances=2", "cores_per_instance=1",
                        f"cache_dir={cache}")
    assert len(record["instance_reports"]) == 2
    hits = [inst["framework"]["cache_hits"] for inst in record["instance_reports"]]
    for stage in STAGES[kind]:  # exactly one instance built each artifact; the other waited and reused it
        assert sorted(h[stage] for h in hits) == [False, True], hits
    onnx = cache / "onnx"
    artifacts = sorted(p.name for p in onnx.iterdir() if p.name != LOCK_DIR)
    assert len(artifacts) == len(STAGES[kind]) and not [a for a in artifacts if a.startswith(".")], artifacts
    for artifact in artifacts:  # complete, and no scratch file of a tool (quantize_dynamic's *-inferred.onnx)
        assert sorted(p.name for p in (onnx / artifact).iterdir()) == [MANIFEST, "model.onnx"], artifact
        assert damage(onnx / artifact) is None

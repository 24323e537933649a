import pytest

from corescale.workload.flops import encoder_flops, forward_flops
from corescale.workload.models import resolve_model

REFERENCE_GFLOP = {8: 1.36, 64: 11.02, 128: 22.35, 256: 45.90, 512: 96.64}  # bert-base, shared/reference §4


@pytest.mark.parametrize("seq,gflop", REFERENCE_GFLOP.items())
def test_bert_base_reference_figures(seq, gflop):
    assert encoder_flops(12, 768, 3072, seq) / 1e9 == pytest.approx(gflop, abs=0.01)


def test_forward_scales_with_batch_and_uses_model_spec():
    spec = resolve_model("bert-base")
    assert forward_flops(spec, 8, 128) == pytest.approx(8 * 22.35e9, rel=1e-3)
    tiny = resolve_model("bert-tiny")
    assert forward_flops(tiny, 1, 128) == encoder_flops(2, 128, 512, 128)
    distil = resolve_model("distilbert-base")
    assert forward_flops(distil, 1, 128) == pytest.approx(22.35e9 / 2, rel=1e-3)

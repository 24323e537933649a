"""A toy precision registered from the test suite: fp16, with every fact of its own, so that a stage still keeping
its own table of precisions (the drift gate, the tuner's offer and first trials, the bundle's CPU features, the
GEMM peak, memory traffic, the projection's tiers) shows in tests/test_toy_precision.py.

Its registry line is this module's; the toy backend (tests/toy_backend) computes in it, and imports this module
first, so every process started with TOY_ENV has both (docs/adding-a-backend.md, "Adding a precision")."""

from corescale.machine.precisions import Precision, register_precision

FP16 = Precision(
    bytes=2, computes={"x86_64": ("avx512_fp16", "amx_fp16"), "aarch64": ("asimdhp",)},
    requires={"x86_64": ("avx2", "fma", "avx512f", "avx512_fp16", "amx_tile", "amx_fp16"), "aarch64": ("asimdhp",)},
    drift_tolerance=3e-2, min_cosine=0.9995, reduced=True, rank=1, anywhere=False, peak_libraries=("torch_mm",),
    gemm_dtype="float16", tiers={"x86_64": (("amx", 4.0), ("avx512", 1.0)), "aarch64": (("neon", 1.0),)})

register_precision("fp16", FP16)

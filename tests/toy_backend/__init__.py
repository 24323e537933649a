"""A toy backend registered from the test suite: pure numpy, "the model" is one embedding lookup and one matmul.

Laid out like a backend's folder (options.py declares its entry, backend.py runs it, recipe.py deploys it); this
module is its registry line. Processes started by the tests find it with PYTHONPATH=tests and
CORESCALE_BACKENDS=toy_backend (docs/adding-a-backend.md).
"""

import toy_precision  # noqa: F401 (registers fp16, which the toy computes in, before the toy registers)

from corescale.backends import register
from toy_backend.options import TOY

register("toy", TOY)

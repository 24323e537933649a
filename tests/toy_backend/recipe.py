"""The toy backend's deployment snippet."""

from __future__ import annotations


def snippet(cfg, threads: int, model: str) -> str:
    return (f"import numpy as np\n\n{model}# the toy model: activation(embedding[input_ids] @ weight), "
            f"activation={cfg.backend.activation}, {threads} thread(s)\n")

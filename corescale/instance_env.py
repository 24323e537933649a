"""Per-instance process environment and command line: thread counts and pinning set before any import."""

from __future__ import annotations

import os

from corescale.cpulist import format_cpulist


def environment(cfg, placement: dict) -> dict[str, str]:
    env = dict(os.environ)
    threads = str(placement["threads"])
    env.update({
        "OMP_NUM_THREADS": threads,
        "MKL_NUM_THREADS": threads,
        "TF_NUM_INTRAOP_THREADS": threads,
        "TF_NUM_INTEROP_THREADS": str(cfg.interop_threads),
        "CORESCALE_INSTANCE_CPUS": format_cpulist(placement["cpus"]),
        "PYTHONUNBUFFERED": "1",
    })
    return env

def command(placement: dict, argv: list[str]) -> list[str]:
    return argv

"""Examples written beside a bundle: a systemd unit and a Dockerfile snippet that run `corescale serve` on it."""

from __future__ import annotations

import re
from typing import Any

from corescale.measure.http.contract import API_KEY_ENV, STOP_S, Layout

SYSTEMD, DOCKERFILE, README = "corescale-serve.service", "Dockerfile.example", "README.md"


def files(serving: dict[str, Any], layout: Layout, pins: str = "") -> dict[str, str]:
    cpus = sorted({c for inst in layout.instances for c in inst.cpus})
    count = len(layout.instances)
    return {SYSTEMD: systemd_unit(), DOCKERFILE: dockerfile(cpus, pins), README: readme(serving, count, cpus)}


def pip_pins(libraries: dict[str, str | None]) -> str:
    """The measured library versions serve requires, as pip pins ("onnxruntime==1.32.0 ..."); a name or version
    that is not plain letters, digits and ._+- (a manifest edited by hand) is left out."""
    return " ".join(f"{name}=={version}" for name, version in libraries.items()
                    if version and re.fullmatch(r"[A-Za-z0-9_.+-]+", f"{name}{version}"))


def systemd_unit() -> str:
    return f"""# Example: install the bundle at /opt/corescale/bundle and corescale in /opt/corescale/venv, then
#   cp corescale-serve.service /etc/systemd/system/ && systemctl enable --now corescale-serve
# SIGTERM (systemctl stop) drains what was accepted and exits 0. KillMode=mixed sends it to corescale alone (the
# instances end when it tells them; they ignore SIGTERM anyway); the stop timeout leaves room for the whole drain.
[Unit]
Description=corescale serve (the measured deployment)
After=network-online.target

[Service]
ExecStart=/opt/corescale/venv/bin/corescale serve /opt/corescale/bundle --host 127.0.0.1 --port 8080
# the key, when the service is reachable by others: {API_KEY_ENV}=...
EnvironmentFile=-/etc/corescale/serve.env
Restart=on-failure
KillSignal=SIGTERM
KillMode=mixed
TimeoutStopSec={STOP_S:g}
DynamicUser=yes
CacheDirectory=corescale
RuntimeDirectory=corescale

[Install]
WantedBy=multi-user.target
"""


def dockerfile(cpus: list[int], pins: str = "") -> str:
    listed = ",".join(map(str, cpus))
    return f"""# Example: the bundle and corescale in one image; run it with the measured CPUs, e.g.
#   docker build -f Dockerfile.example -t corescale-serve . && \\
#   docker run --cpuset-cpus={listed} --stop-timeout {STOP_S} -p 127.0.0.1:8080:8080 corescale-serve
# (the instances are pinned to CPUs {listed}: the container must be given them; --stop-timeout: the drain takes
# up to {STOP_S} s, docker's default 10 s would kill it midway). The port is published on the host's loopback
# only: to open it to others, set a key (--env-file holding {API_KEY_ENV}=...) and publish it on the address
# they reach. A bundle is code: build images only from bundles you trust (docs/deploy.md).
FROM python:3.11-slim
RUN apt-get update && apt-get install -y --no-install-recommends numactl libjemalloc2 libgoogle-perftools4 tini \\
    && rm -rf /var/lib/apt/lists/*
# the libraries at the versions the bundle was measured with (serve refuses others)
RUN pip install --no-cache-dir 'corescale[all]' {pins}
COPY . /bundle
USER 65532:65532
ENV HOME=/tmp
EXPOSE 8080
STOPSIGNAL SIGTERM
# tini as PID 1: signals reach corescale at once and orphans are reaped
ENTRYPOINT ["tini", "--"]
CMD ["corescale", "serve", "/bundle", "--host", "0.0.0.0", "--port", "8080"]
"""


def readme(serving: dict[str, Any], count: int, cpus: list[int]) -> str:
    backend = serving["backend"]["name"]
    return f"""# corescale deployment bundle

`corescale serve .` starts what was measured: {count} pinned instance(s) of {serving["model"]} on {backend}
({serving["precision"]}), CPUs {",".join(map(str, cpus))}, dynamic batching up to {serving["server"]["max_batch"]}
inputs per call. `manifest.json` holds every file's sha256, the layout, the measured figures and what this
machine must have (CPU features, library versions); `record.json` is the measured record.
Examples: `{SYSTEMD}` (systemd), `{DOCKERFILE}` (a container). Routes: POST /v1/embeddings (OpenAI), /embed,
/rerank, /predict, /tokenize (Hugging Face's text-embeddings-inference), GET /health, /metrics.
"""

"""What `corescale serve` and the trials that measure it (endpoint=managed, measure/http/managed.py) agree on: its ready
line, the metric that says what its front cost, the variable that holds the API key, how long a stop takes, and
GET /info (ServiceInfo).
Both sides import it from here; nothing else spells them."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Any

from corescale.typed import Section

READY = "listening on http://"  # the ready line ends with it: "...; front on WHERE; listening on http://HOST:PORT"
FRONT = "; front on "  # the ready line's word on where the HTTP front runs
FRONT_CPU_METRIC = "corescale_front_cpu_seconds"  # the front's CPU time since the service started (GET /metrics)
API_KEY_ENV = "CORESCALE_API_KEY"  # sent as `Authorization: Bearer KEY` (kept out of the config and the record)
GRACEFUL_S = 60  # after a stop signal, the longest the service waits for accepted requests
STOP_S = 90  # the longest it takes to stop after the signal (the drain, then the instances'): a manager's timeout


def is_loopback_host(host: str) -> bool:
    """`localhost` or a loopback address (127.0.0.0/8, ::1, bracketed or not): where a key may go in clear, and the
    only Host names a loopback service without a key answers. A name that merely starts with "127." is not."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def ready_line(what: str, front: str, host: str, port: int) -> str:
    """What the service prints once it answers: `what` is ready, where its front runs, its URL."""
    return f"{what} ready{FRONT}{front}; {READY}{authority(host, port)}"


def authority(host: str, port: int) -> str:
    """host:port as a URL writes it (an IPv6 address in brackets: `[::1]:8000`)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def url_in(ready: str) -> str:
    """The base URL a ready line names."""
    return "http://" + ready.split(READY, 1)[1].strip()


def front_in(ready: str) -> str:
    """Where a ready line says the front runs ("CPUs 2-3", "shared with the instances"); "" when it does not."""
    return ready.split(FRONT, 1)[1].split(";", 1)[0] if FRONT in ready else ""


@dataclass(frozen=True)
class InstanceLayout(Section):
    """One instance as it runs: its CPUs, memory nodes, threads, batch and the launch the launcher recorded (the
    command prefix, the variables set); in GET /info also the artifact it loaded."""

    id: int
    cpus: list[int]
    numa_nodes: list[int]
    threads: int
    batch_size: int
    command_prefix: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    artifact: str | None = None  # GET /info only: the file its backend runs (None: not said)
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        data = super().to_dict()
        return data if self.artifact is not None else {k: v for k, v in data.items() if k != "artifact"}


@dataclass(frozen=True)
class Layout(Section):
    """The instances of a service and what they share (a bundle's manifest and GET /info hold it)."""

    instances: list[InstanceLayout]
    allocator: str | None = None
    openmp: str | None = None
    interop_threads: int | None = None
    front: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class WhatRuns(Section):
    """GET /info's `corescale` part: what runs (the source, the serving config, the layout)."""

    source: str  # the bundle folder, or "overrides"
    backend: str
    precision: str
    config: dict[str, Any]
    layout: Layout
    engine: str = "corescale serve"  # what serves: `corescale serve`, or "ray serve" (corescale deploy --target ray)
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ServiceInfo(Section):
    """GET /info: Hugging Face text-embeddings-inference's fields, and under `corescale` what runs."""

    model_id: str
    model_dtype: str
    model_type: dict[str, Any]  # {TEI's type: the head}
    max_input_length: int
    max_client_batch_size: int
    max_batch_requests: int
    version: str
    corescale: WhatRuns
    extra: dict[str, Any] = field(default_factory=dict)

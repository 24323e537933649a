"""The machine catalog: cloud CPU kinds with their price, cores, SMT, ISA and memory, every row checked.

A row is one machine kind (an instance type) at an on-demand list price, with the region, the date and the page
the price comes from. Its CPU's facts come from the file's `cpus:` section (`cpu: KEY`) or from the row itself.
Bad rows are one UserError line naming the row and every problem in it (exit 2). parse_catalog() is the one
function that turns a file's text into machines, so any reader (a bounded one for user files) can feed it.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import yaml

from corescale.errors import UserError
from corescale.userfiles import read_text

ISA_NAMES = ("avx2", "avx_vnni", "avx512", "avx512_vnni", "avx512_bf16", "amx",  # x86-64
             "neon", "sve", "sve2", "i8mm", "bf16")  # aarch64
ARCHES = ("x86_64", "aarch64")
X86 = frozenset(ISA_NAMES[:6])
STREAM_EFFICIENCY = 0.8  # the triad reaches about this share of the DDR channels' theoretical rate on servers
CPU_FIELDS = ("model", "family", "arch", "isa", "memory", "memory_bandwidth_gbps")
ROW_FIELDS = ("cpu", "price_per_hour", "vcpus", "physical_cores", "smt", "cloud", "region", "date", "source",
              "note", "cpu_model", "history", *CPU_FIELDS)
SHAPE = ("a mapping `machines: {NAME: {price_per_hour: US$/h, vcpus: N, physical_cores: N, date: YYYY-MM, "
         "source: PAGE, ...}}` (see the packaged corescale/data/machines.yaml)")


@dataclass(frozen=True)
class Machine:
    """One machine kind: its price and size, and the facts of its CPU the projection reads."""

    name: str
    price_per_hour: float
    vcpus: int
    physical_cores: int
    cpu_model: str = ""
    note: str = ""
    measured_here: bool = False  # the price is for the very machine the results were measured on
    smt: int = 1
    family: str = ""
    arch: str = ""
    isa: frozenset[str] = field(default_factory=frozenset)
    bandwidth_gbps: float | None = None  # sustainable memory bandwidth of the whole kind (None: unknown)
    bandwidth_basis: str = ""  # how it was found: measured, or channels x rate x share
    cloud: str = ""
    region: str = ""
    date: str = ""
    source: str = ""
    history: bool = False  # a price quoted in the past (the 2021 study's): shown as history, never offered

    @property
    def core_hour(self) -> float:
        """US$ per physical-core-hour: what decides a projection's cost when copies fill the cores."""
        return self.price_per_hour / self.physical_cores if self.physical_cores else math.inf

    @property
    def cpu_text(self) -> str:
        return self.family or self.cpu_model or "CPU unnamed"


def load_catalog(path: str | Path | None = None) -> dict[str, Machine]:
    """Machines of the packaged catalog, or of a YAML file with the same layout (--catalog)."""
    if path is None:
        return dict(packaged())
    return parse_catalog(read_text(path, "machine catalog"), f"machine catalog '{path}'")


@functools.lru_cache(maxsize=1)
def packaged() -> dict[str, Machine]:
    """The packaged catalog, read once per process."""
    text = (resources.files("corescale") / "data" / "machines.yaml").read_text()
    return parse_catalog(text, "the packaged machine catalog")


def parse_catalog(text: str, where: str) -> dict[str, Machine]:
    """Every machine of a catalog's text, each checked; `where` names the file in the one error line."""
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise UserError(f"cannot read {where}: {' '.join(str(exc).split())}") from None
    entries = document.get("machines") if isinstance(document, dict) else None
    if not isinstance(entries, dict) or not entries:
        raise UserError(f"{where} holds no machines: expected {SHAPE}")
    cpus = document.get("cpus") or {}
    if not isinstance(cpus, dict):
        raise UserError(f"{where}: `cpus:` must map a CPU's key to its facts ({', '.join(CPU_FIELDS)})")
    return {str(name): machine(str(name), entry, cpus, where) for name, entry in entries.items()}


def machine(name: str, entry, cpus: dict, where: str) -> Machine:
    """One row, with its CPU's facts merged in, checked: every problem of the row in one line."""
    if not isinstance(entry, dict):
        raise UserError(f"machine '{name}' in {where} must be a mapping of its fields (got {entry!r})")
    cpu_key = entry.get("cpu")
    if cpu_key is not None and cpu_key not in cpus:
        raise UserError(f"machine '{name}' in {where} names cpu '{cpu_key}', which its `cpus:` section does not "
                        f"hold; known: {', '.join(map(str, cpus)) or 'none'}")
    facts = {**(cpus.get(cpu_key) or {}), **entry} if cpu_key is not None else dict(entry)
    problems = row_problems(facts)
    if problems:
        raise UserError(f"machine '{name}' in {where}: {'; '.join(problems)}")
    physical, vcpus = int(facts["physical_cores"]), int(facts["vcpus"])
    bandwidth, basis = memory_bandwidth(facts, physical)
    return Machine(
        name, float(facts["price_per_hour"]), vcpus, physical,
        cpu_model=str(facts.get("cpu_model") or facts.get("model") or ""), note=str(facts.get("note") or ""),
        smt=int(facts.get("smt") or vcpus // physical), family=str(facts.get("family") or ""),
        arch=str(facts.get("arch") or ""), isa=frozenset(facts.get("isa") or ()), bandwidth_gbps=bandwidth,
        bandwidth_basis=basis, cloud=str(facts.get("cloud") or ""), region=str(facts.get("region") or ""),
        date=str(facts["date"]), source=str(facts["source"]), history=bool(facts.get("history")))


def _count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _positive(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def row_problems(row: dict) -> list[str]:
    """What is wrong with one merged row (empty: usable)."""
    problems = [f"unknown field '{k}' (known: {', '.join(ROW_FIELDS)})" for k in row if k not in ROW_FIELDS]
    if not _positive(row.get("price_per_hour")):
        problems.append(f"price_per_hour={row.get('price_per_hour')!r} is not a finite number > 0 (US$ per hour)")
    for name in ("vcpus", "physical_cores"):
        if not _count(row.get(name)):
            problems.append(f"{name}={row.get(name)!r} is not a whole number >= 1")
    if _count(row.get("vcpus")) and _count(row.get("physical_cores")):
        problems += _smt_problems(row)
    for name in ("date", "source"):
        if not str(row.get(name) or "").strip():
            problems.append(f"no {name} (every price needs the {'day' if name == 'date' else 'page'} it was read)")
    isa = row.get("isa")
    if isa is not None and not (isinstance(isa, list) and all(isinstance(i, str) for i in isa)):
        problems.append(f"isa={isa!r} is not a list of names")
    elif isa:
        unknown = sorted(set(isa) - set(ISA_NAMES))
        if unknown:
            problems.append(f"unknown ISA name(s) {', '.join(unknown)} (known: {', '.join(ISA_NAMES)})")
    if row.get("arch") is not None and row.get("arch") not in ARCHES:
        problems.append(f"arch={row.get('arch')!r} is not one of {', '.join(ARCHES)}")
    return problems + _memory_problems(row)


def _smt_problems(row: dict) -> list[str]:
    vcpus, physical, smt = row["vcpus"], row["physical_cores"], row.get("smt")
    if physical > vcpus:
        return [f"more physical_cores ({physical}) than vcpus ({vcpus})"]
    if smt is None:
        return [] if vcpus % physical == 0 else [f"vcpus ({vcpus}) is not a multiple of physical_cores ({physical})"]
    if not _count(smt) or vcpus != physical * smt:
        return [f"smt={smt!r} does not give vcpus = physical_cores x smt ({vcpus} != {physical} x {smt})"]
    return []


def _memory_problems(row: dict) -> list[str]:
    memory, measured = row.get("memory"), row.get("memory_bandwidth_gbps")
    problems = []
    if measured is not None and not _positive(measured):
        problems.append(f"memory_bandwidth_gbps={measured!r} is not a finite number > 0")
    parts = ("channels", "mts", "socket_cores")
    if memory is not None and (not isinstance(memory, dict) or set(memory) - set(parts)
                               or not all(_count(memory.get(k)) for k in parts)):
        problems.append(f"memory={memory!r} is not {{channels: N, mts: N, socket_cores: N}} (whole numbers)")
    return problems


def memory_bandwidth(row: dict, physical_cores: int) -> tuple[float | None, str]:
    """(GB/s the kind can sustain, how it was found): a measured figure, else its cores' share of its sockets'
    channels x rate x 8 bytes x STREAM_EFFICIENCY; (None, reason) when the catalog does not say."""
    if row.get("memory_bandwidth_gbps") is not None:
        return float(row["memory_bandwidth_gbps"]), "measured (catalog)"
    memory = row.get("memory")
    if not memory:
        return None, "memory bandwidth not in the catalog"
    socket = memory["channels"] * memory["mts"] * 8 / 1e3  # GB/s, theoretical
    share = physical_cores / memory["socket_cores"]
    return socket * share * STREAM_EFFICIENCY, (
        f"{memory['channels']} channels x {memory['mts']} MT/s x 8 B x {STREAM_EFFICIENCY:g} (triad share) x "
        f"{physical_cores}/{memory['socket_cores']} of a socket's cores")


# the environment's /proc/cpuinfo flags (machine/environment.py ISA_FLAGS) in the catalog's ISA names
FLAG_NAMES = {"avx2": "avx2", "avx_vnni": "avx_vnni", "avx512f": "avx512", "avx512_vnni": "avx512_vnni",
              "avx512_bf16": "avx512_bf16", "amx_tile": "amx", "amx_int8": "amx", "amx_bf16": "amx",
              "asimd": "neon", "sve": "sve", "sve2": "sve2", "i8mm": "i8mm", "bf16": "bf16"}


def catalog_isa(flags: dict[str, bool] | None) -> frozenset[str]:
    """A CPU's flags (environment.cpuinfo()'s `isa`) as catalog ISA names."""
    return frozenset(FLAG_NAMES[f] for f, present in (flags or {}).items() if present and f in FLAG_NAMES)


def arch_of(isa: frozenset[str]) -> str:
    """x86_64 or aarch64 from the ISA names ('' when there are none)."""
    if not isa:
        return ""
    return "x86_64" if isa & X86 else "aarch64"


def price_age(date: str, today=None) -> str:
    """How old a price of `date` (YYYY-MM or YYYY-MM-DD) is today: '18 months old' ('age unknown' when the date
    does not parse)."""
    import datetime

    today = today or datetime.date.today()
    try:
        year, month = (int(part) for part in str(date).split("-")[:2])
    except ValueError:
        return "age unknown"
    months = (today.year - year) * 12 + today.month - month
    return "this month" if months <= 0 else f"{months} month{'s' if months != 1 else ''} old"


def _model_numbers(text: str) -> set[str]:
    # a model number: a word of 4+ characters with a digit, not all digits (8275CL, 8488C, 9R45, 7R13)
    return {token.lower() for token in re.findall(r"\b\w{4,}\b", text or "")
            if any(c.isdigit() for c in token) and not token.isdigit()}


def same_cpu(machine: Machine, cpu_model: str | None) -> bool:
    """The catalog CPU's model number (e.g. 8275CL, 7R13) appears in the measured CPU's model name."""
    return bool(_model_numbers(machine.cpu_model) & _model_numbers(cpu_model or ""))


VENDORS = ("intel", "amd", "graviton", "axion", "cobalt")


def vendor_of(model: str | None) -> str:
    """The CPU's vendor (or Arm design) from its model name: intel, amd, graviton, axion, cobalt ('' unknown)."""
    lower = (model or "").lower()
    found = next((v for v in VENDORS if v in lower), "")
    return found or ("intel" if "xeon" in lower else "amd" if "epyc" in lower else "")


def family_of(model: str | None) -> str:
    """The microarchitecture of a measured CPU, from the packaged catalog's CPU with the same model number
    ('' when the catalog does not hold it)."""
    return next((kind.family for kind in packaged().values() if kind.family and same_cpu(kind, model)), "")


def find_machine(name: str, catalog: dict[str, Machine]) -> Machine:
    if name not in catalog:
        raise UserError(f"unknown machine '{name}'; known: {', '.join(sorted(catalog))} "
                        "(or give --price-per-hour for the machine you measured on)")
    return catalog[name]

"""What the measured machine costs, and where that price comes from — for every answer that shows a cost.

In order: a price given for it (--price-per-hour, cost.price_per_hour=: the whole machine); the catalog kind it
was declared to be (--this-machine / cost.machine=: refused when the CPU does not match); the catalog kind its CPU
model and core count match; otherwise the layout's physical cores at the per-physical-core-hour rate of the
catalog kind nearest to its CPU (same architecture and vendor, the same instruction tiers, then the cheapest
core-hour), named in the answer.
"""

from __future__ import annotations

from dataclasses import dataclass

from corescale.analysis.catalog import Machine, arch_of, find_machine, same_cpu
from corescale.errors import UserError

GIVEN, KIND, RATE = "given", "catalog kind", "core-hour rate"


@dataclass(frozen=True)
class Price:
    """US$ per hour of what one measured layout occupies, and the sentence saying where it comes from."""

    per_hour: float
    kind: str  # given | catalog kind | core-hour rate
    source: str

    def per_million(self, samples_per_s: float | None, tokens_per_sample: float | None = None) -> \
            tuple[float | None, float | None]:
        """(US$ per 1M inferences, per 1M real tokens) at a sustained rate; None where it cannot be said."""
        if not samples_per_s or samples_per_s <= 0:
            return None, None
        inferences = per_million(self.per_hour, samples_per_s)
        return inferences, inferences / tokens_per_sample if tokens_per_sample else None


def per_million(price_per_hour: float, per_s: float) -> float:
    """US$ per one million units (inferences, tokens) at `per_s` units a second."""
    return price_per_hour / (per_s * 3600) * 1e6 if per_s > 0 else float("inf")


def is_this(machine: Machine, cpu_model: str | None, physical_cores) -> bool:
    """The kind is the measured machine: the same CPU model and as many physical cores."""
    return machine.measured_here or (machine.physical_cores == physical_cores and same_cpu(machine, cpu_model))


def declared(name: str, catalog: dict[str, Machine], cpu_model: str | None, physical_cores) -> Machine:
    """The catalog kind a user says the results were measured on; refused when its CPU or size differ."""
    kind = find_machine(name, catalog)
    if not is_this(kind, cpu_model, physical_cores):
        raise UserError(f"{name} ({kind.cpu_model or 'CPU unnamed'}, {kind.physical_cores} cores) is not the "
                        f"measured machine ({cpu_model or 'CPU unnamed'}, {physical_cores} cores): its price cannot "
                        f"be a measured cost (corescale cost --machine {name} projects onto it)")
    return kind


def nearest_rate(catalog: dict[str, Machine], isa: frozenset[str], cpu_model: str | None) -> Machine:
    """The kind whose core-hour prices a machine that is not in the catalog: same architecture, then the same
    vendor, then the most ISA names in common (fewest different), then the cheapest core-hour."""
    arch, vendor = arch_of(isa), _vendor(cpu_model or "")

    def distance(kind: Machine):
        return (kind.arch != arch, _vendor(kind.cpu_model) != vendor, len(kind.isa ^ isa), kind.core_hour)

    return min((k for k in catalog.values() if not k.name.startswith("study-")), key=distance)


def _vendor(model: str) -> str:
    from corescale.analysis.catalog import vendor_of

    return vendor_of(model)


def price_here(row, catalog: dict[str, Machine], given: float | None = None, kind_name: str | None = None) -> Price:
    """The price of one measured layout (a results row: cpu_model, cpu_isa, host_physical_cores, cpus_total,
    use_logical_cores), from the first source that applies (see the module's docstring)."""
    from corescale.analysis.projection import measured_of

    cpu, cores = row.get("cpu_model"), row.get("host_physical_cores")
    if given is not None:
        return Price(given, GIVEN, f"this machine at the given US${given:g}/h")
    if kind_name:
        kind = declared(kind_name, catalog, cpu, cores)
        return Price(kind.price_per_hour, KIND, f"this machine is {_kind_text(kind)} (declared)")
    for kind in catalog.values():
        if is_this(kind, cpu, cores) and not kind.name.startswith("study-"):
            return Price(kind.price_per_hour, KIND, f"this machine is {_kind_text(kind)} (matched by CPU model and "
                                                    f"{kind.physical_cores} cores)")
    measured = measured_of(row)
    used = max(int(row.get("instances") or 1), 1) * measured.cores_per_instance
    kind = nearest_rate(catalog, measured.isa, cpu)
    return Price(kind.core_hour * used, RATE,
                 f"{used} physical core(s) × {kind.name}'s US${kind.core_hour:.4g}/core-hour ({kind.cpu_text}, "
                 f"nearest in the catalog; {_list_price(kind)}); this machine's own price per hour, when given, "
                 "replaces it")


def _kind_text(kind: Machine) -> str:
    return f"{kind.name} at US${kind.price_per_hour:g}/h ({_list_price(kind)})"


def _list_price(kind: Machine) -> str:
    where = " ".join(part for part in (kind.cloud, kind.region) if part and part != "unstated")
    from corescale.analysis.catalog import price_age

    return f"{where + ' ' if where else ''}list price of {kind.date}, {price_age(kind.date)}"



def record_cost(record) -> tuple[float | None, float | None, str]:
    """(US$ per 1M inferences, per 1M real tokens, where the price comes from) of one trial record, priced by
    its config's `cost.*` keys."""
    from pathlib import Path

    from corescale.analysis.catalog import load_catalog
    from corescale.analysis.projection import measured_of
    from corescale.analysis.store import flatten

    row = flatten(record, Path("."))
    settings = record.config.cost
    price = price_here(row, load_catalog(settings.catalog), settings.price_per_hour, settings.machine)
    measured = measured_of(row)
    inferences, tokens = price.per_million(measured.per_instance * int(row.get("instances") or 1),
                                           measured.tokens_per_sample)
    return inferences, tokens, price.source


def check_settings(settings, cpu_model: str | None, physical_cores: int | None) -> None:
    """The `cost.*` keys of a run, before any worker starts: a readable catalog, a known kind that is this
    machine (its CPU model and core count), else one UserError line."""
    from corescale.analysis.catalog import load_catalog

    catalog = load_catalog(settings.catalog)
    if settings.machine:
        declared(settings.machine, catalog, cpu_model, physical_cores)

"""The spec's `cost` section: what each accelerator type costs per device-hour, with each price's date and source.

Prices are the user's data, never defaults in code: a sweep without them logs no money
figure. A price file holds the same rows (CSV, or YAML shaped like `cost.prices`); `examples/prices.csv`
is an example with dated public prices and their sources.

A device is one GPU on a GPU trial, one CPU core on a CPU trial: `cpu` (or a CPU node type's label)
is priced per core-hour."""

from __future__ import annotations

import csv
import datetime
import io
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from sweeps.spec.params import STRICT

CPU = "cpu"  # the type a CPU trial not pinned to a node type is priced as
SAVED_PRICES = "_saved_prices"  # in a cost section: the prices the sweep read from its price_file when it started
_COLUMNS = ("accelerator_type", "usd_per_hour", "date", "source")


class Price(BaseModel):
    model_config = STRICT
    usd_per_hour: float = Field(gt=0, allow_inf_nan=False, description="US dollars per device-hour: per GPU-hour for a GPU type, per "
                                "core-hour for `cpu` or a CPU node type")
    date: datetime.date = Field(description="when the price was read (YYYY-MM-DD): prices change")
    source: str = Field(min_length=1, description="where it was read: a price page, a catalog file and its version, "
                        "an invoice")

    @field_validator("date", mode="before")
    @classmethod
    def _iso(cls, value: Any) -> Any:
        """YAML reads 2026-11-26 as a date and a CSV cell as text: both are accepted."""
        if isinstance(value, str):
            try:
                return datetime.date.fromisoformat(value.strip())
            except ValueError:
                raise ValueError(f"must be a date YYYY-MM-DD, got {value!r}") from None
        return value


def _problem(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())


def read_price_file(path: str) -> dict[str, Price]:
    """Read the prices in a file.

    CSV with the header accelerator_type,usd_per_hour,date,source, or YAML mapping each type to
    {usd_per_hour, date, source}. A bad row raises `ValueError` naming its line (or key) and field."""
    file = Path(path)
    try:
        text = file.read_text()
    except OSError as exc:
        raise ValueError(f"cannot read the price file {path}: {exc.strerror or exc}; give a path relative to the "
                         "working directory (or absolute)") from None
    rows: list[tuple[str, str, Any]] = []  # (where, type, the row's fields)
    if file.suffix.lower() in (".yaml", ".yml"):
        data = yaml.safe_load(text) or {}
        data = data.get("prices", data) if isinstance(data, dict) else data
        if not isinstance(data, dict):
            raise ValueError(f"{path}: a YAML price file maps each accelerator type to {{usd_per_hour, date, source}}")
        rows = [(f"{path}: {key}", str(key), value) for key, value in data.items()]
    else:
        reader = csv.DictReader(io.StringIO(text))
        if tuple(c.strip() for c in reader.fieldnames or ()) != _COLUMNS:
            raise ValueError(f"{path} line 1: the header must be {','.join(_COLUMNS)}, got "
                             f"{','.join(reader.fieldnames or ()) or 'nothing'}")
        for row in reader:
            if not any((v or "").strip() for v in row.values()):
                continue
            where = f"{path} line {reader.line_num}"
            if None in row or any(row.get(c) is None for c in _COLUMNS):
                raise ValueError(f"{where}: expected {len(_COLUMNS)} cells ({','.join(_COLUMNS)})")
            kind = row["accelerator_type"].strip()
            try:
                cost = float(row["usd_per_hour"])
            except ValueError:
                raise ValueError(f"{where} ({kind}): usd_per_hour must be a number, got "
                                 f"{row['usd_per_hour']!r}") from None
            rows.append((where, kind, {"usd_per_hour": cost, "date": row["date"], "source": row["source"].strip()}))
    prices: dict[str, Price] = {}
    for where, kind, fields in rows:
        if not kind:
            raise ValueError(f"{where}: accelerator_type is empty")
        if kind in prices:
            raise ValueError(f"{where}: {kind} is priced twice; keep one row per type")
        try:
            prices[kind] = Price.model_validate(fields, strict=False)
        except ValidationError as exc:
            raise ValueError(f"{where} ({kind}): {_problem(exc)}") from None
    if not prices:
        raise ValueError(f"{path}: no prices in it")
    return prices


class CostSpec(BaseModel):
    model_config = STRICT
    prices: dict[str, Price] = Field(default_factory=dict, json_schema_extra={"key_name": "type"}, description="each accelerator type's price per device-hour "
                                     "with its date and source, e.g. {H100: {usd_per_hour: 3.29, date: 2026-11-26, "
                                     "source: ...}}; GPU types by the name Ray labels them with, `cpu` per core-hour")
    price_file: str | None = Field(default=None, description="or a file of the same prices (CSV: accelerator_type,"
                                   "usd_per_hour,date,source; or YAML); relative: to the working directory")

    @model_validator(mode="before")
    @classmethod
    def _from_file(cls, data: Any) -> Any:
        """The file's prices become the section's, read once when the sweep starts. A sweep keeps what it
        read (`SAVED_PRICES`, put there by `sweeps.spec.load.parse_spec`): a resumed sweep and a report read
        the same prices from any directory, whatever the file says now."""
        if isinstance(data, dict) and data.get(SAVED_PRICES) is not None:
            return {**{k: v for k, v in data.items() if k != SAVED_PRICES}, "prices": data[SAVED_PRICES]}
        if not isinstance(data, dict) or data.get("price_file") is None:
            return data
        if data.get("prices"):
            raise ValueError("give prices or price_file, not both")
        path = data["price_file"]
        if not isinstance(path, str):
            raise ValueError("price_file: a path")
        return {**data, "prices": read_price_file(path)}

    @model_validator(mode="after")
    def _some(self) -> CostSpec:
        if not self.prices:
            raise ValueError("no prices: give prices (accelerator type -> {usd_per_hour, date, source}) or "
                             "price_file, or remove the cost section")
        return self

    def price(self, kind: str) -> Price | None:
        return self.prices.get(kind)

    def saved(self) -> dict[str, dict[str, Any]]:
        """The prices as a sweep keeps them (JSON): what `parse_spec(..., prices=)` takes back."""
        return {k: p.model_dump(mode="json") for k, p in self.prices.items()}


# What a trial of a spec runs on and what it costs: read by the search (each trial's config), the
# service (placement, the plan) and the results (the answer). `spec` is a `SweepSpec`.
def accelerator_types(spec: Any) -> list[str]:
    """Every accelerator type a trial of the space may be pinned to, in the space's order ("" : not pinned)."""
    from sweeps.spec.params import param_values

    p = spec.space.accelerator_type
    if p is None:
        return [spec.scaling.accelerator_type or ""]
    return [str(v) for v in param_values(p)]


def priced_type(spec: Any, kind: str) -> str | None:
    """Return the price list's type a trial pinned to `kind` ("" : not pinned) is priced as.

    Its own type; an unpinned CPU trial is `cpu`; an unpinned GPU trial the one GPU type priced (None when there
    are several)."""
    if kind:
        return kind
    if not spec.scaling.use_gpu:
        return CPU
    gpu_types = [k for k in (spec.cost.prices if spec.cost is not None else {}) if k != CPU]
    return gpu_types[0] if len(gpu_types) == 1 else None


def held_loader_workers(spec: Any, loader_workers: int) -> int:
    """Return the loader workers' share a trial's ranks hold.

    In a warm group (`scaling.reuse_workers`), the most any trial of the space starts, since the group is
    started with that many and holds them while it serves any trial; a trial of its own holds its own."""
    from sweeps.spec.params import param_values

    if not spec.scaling.reuse_workers:
        return loader_workers
    return int(max(param_values(spec.space.held("num_dataloader_workers"))))


def devices(spec: Any, num_workers: int, loader_workers: int) -> float:
    """Return what a trial's price is multiplied by.

    Its GPUs, or on CPU the cores it holds (loaders included: `held_loader_workers`)."""
    held = spec.scaling.per_trial(held_loader_workers(spec, loader_workers), num_workers)
    return held["GPU"] if spec.scaling.use_gpu else held["CPU"]


def usd_per_hour(spec: Any, kind: str, num_workers: int, loader_workers: int) -> float:
    """What a trial's devices cost per hour (0.0: unpriced: no cost section, or no price for its type)."""
    if spec.cost is None:
        return 0.0
    priced = priced_type(spec, kind)
    price = spec.cost.price(priced) if priced is not None else None
    return price.usd_per_hour * devices(spec, num_workers, loader_workers) if price is not None else 0.0

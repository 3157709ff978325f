"""The spec fields that set a trial setting as it is, each made from the setting's one declaration.

Those fields (`budget.num_warmup_steps`, `telemetry.trace_steps`, `seed`, ...) each take their default (a
sweep's), rule and help from the setting's one declaration, `trainables.knobs.TrialSettings`, and name the
setting, so that `trial_settings` reads them all into the trial's config without a second list of them."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from trainables.knobs import REQUIRED, SETTINGS

_TAG = "setting"  # the field's json_schema_extra key naming the setting it sets


def setting_field(name: str) -> Any:
    """The field of a spec section that sets trial setting `name` as it is."""
    kind, default, declared = SETTINGS[name]
    value = declared.sweep_default(default)
    extra: Any = {"json_schema_extra": {_TAG: name}, "description": declared.help, **declared.bounds(kind)}
    return Field(**extra) if value is REQUIRED else Field(default=value, **extra)


def set_by(info: Any) -> str | None:
    """The setting a spec field (pydantic's `FieldInfo`) sets as it is, if any."""
    extra = info.json_schema_extra
    return extra.get(_TAG) if isinstance(extra, dict) else None  # type: ignore[return-value]


def trial_settings(model: BaseModel) -> dict[str, Any]:
    """Every trial setting that `model` (the spec, or one of its sections) sets as it is, by the setting's name."""
    found: dict[str, Any] = {}
    for name, info in type(model).model_fields.items():
        value = getattr(model, name)
        setting = set_by(info)
        if setting is not None:
            found[setting] = value
        elif isinstance(value, BaseModel):
            found |= trial_settings(value)
    return found

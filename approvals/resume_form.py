"""The Resume form a ``suspend()`` call gets, generated from the tool's ``resumeSchema`` (JSON Schema).

Strings, numbers, integers, booleans and enums become inputs; anything else (nested objects, arrays,
unions) gets a JSON text box. A schema that is not a flat object is edited as one JSON box.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

SIMPLE_TYPES = {"string", "number", "integer", "boolean"}


@dataclass
class ResumeField:
    name: str
    kind: str  # string | number | integer | boolean | enum | json
    label: str
    required: bool
    description: str = ""
    choices: list[tuple[str, str]] = field(default_factory=list)  # (index, label) for enums
    value: str = ""
    error: str = ""

    @property
    def input_name(self) -> str:
        return f"resume__{self.name}"


def _field_kind(prop: dict) -> str:
    if "enum" in prop and isinstance(prop["enum"], list) and prop["enum"]:
        return "enum"
    if prop.get("type") in SIMPLE_TYPES:
        return prop["type"]
    return "json"


def build_fields(schema: dict | None) -> list[ResumeField] | None:
    """The fields of a flat object schema, or ``None`` when the whole value is one JSON box."""
    if not isinstance(schema, dict) or schema.get("type") != "object" or not isinstance(schema.get("properties"), dict):
        return None
    required = set(schema.get("required") or [])
    fields = []
    for name, prop in schema["properties"].items():
        prop = prop if isinstance(prop, dict) else {}
        kind = _field_kind(prop)
        fields.append(
            ResumeField(
                name=name,
                kind=kind,
                label=str(prop.get("title") or name),
                required=name in required,
                description=str(prop.get("description") or ""),
                choices=[(str(i), json.dumps(v) if not isinstance(v, str) else v) for i, v in enumerate(prop["enum"])]
                if kind == "enum"
                else [],
            )
        )
    return fields


def parse_resume_form(schema: dict | None, data: Any) -> tuple[Any, list[ResumeField] | None, str]:
    """(resume data, fields with values and errors, error of the whole-JSON box).

    Only the form's own syntax is checked here (a number that is not a number, JSON that does not
    parse); the schema itself is enforced by the engine, which raises ``RESUME_DATA_INVALID``.
    """
    fields = build_fields(schema)
    if fields is None:
        raw = data.get("resume_data", "")
        try:
            return json.loads(raw), None, ""
        except json.JSONDecodeError as exc:
            return None, None, f"Not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})."
        except (ValueError, RecursionError):  # over-long integers, deep nesting
            return None, None, "Not valid JSON: too deep or too large."
    result: dict[str, Any] = {}
    enums = {name: prop.get("enum", []) for name, prop in schema["properties"].items() if isinstance(prop, dict)}
    for f in fields:
        raw = data.get(f.input_name, "")
        f.value = raw if f.kind != "boolean" else ("on" if raw else "")
        if f.kind == "boolean":
            result[f.name] = bool(raw)
        elif f.kind == "string":
            if raw != "" or f.required:
                result[f.name] = raw
        elif f.kind in ("number", "integer"):
            if raw.strip() == "":
                if f.required:
                    f.error = "This field is required."
                continue
            try:
                result[f.name] = int(raw) if f.kind == "integer" else float(raw)
            except ValueError:
                f.error = f"Enter {'a whole number' if f.kind == 'integer' else 'a number'}."
        elif f.kind == "enum":
            if raw == "":
                if f.required:
                    f.error = "Choose one."
                continue
            try:
                result[f.name] = enums[f.name][int(raw)]
            except (ValueError, IndexError):
                f.error = "Choose one of the options."
        else:
            if raw.strip() == "":
                if f.required:
                    f.error = "This field is required."
                continue
            try:
                result[f.name] = json.loads(raw)
            except json.JSONDecodeError as exc:
                f.error = f"Not valid JSON: {exc.msg}."
            except (ValueError, RecursionError):  # over-long integers, deep nesting
                f.error = "Not valid JSON: too deep or too large."
    return result, fields, ""


def attach_engine_errors(fields: list[ResumeField] | None, errors: list[dict]) -> list[str]:
    """Put the engine's validation errors on their fields; return those that name no field."""
    by_name = {f.name: f for f in fields or []}
    loose = []
    for err in errors:
        loc = str(err.get("loc", "$")).split(".")[0]
        message = str(err.get("message", "invalid"))
        if loc in by_name and not by_name[loc].error:
            by_name[loc].error = message
        else:
            loose.append(f"{err.get('loc', '$')}: {message}" if err.get("loc") not in (None, "$") else message)
    return loose

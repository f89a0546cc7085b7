"""The Resume form a ``suspend()`` call gets, generated from the tool's ``resumeSchema`` (JSON Schema).

Strings, numbers, integers, booleans and enums become inputs; anything else (nested objects, arrays,
unions) gets a JSON text box. A schema that is not a flat object is edited as one JSON box.
"""

from __future__ import annotations

import json
import re
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
    schema: dict = field(default_factory=dict)  # the property's JSON Schema (its limits)

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
                schema=prop,
            )
        )
    return fields


def parse_resume_form(schema: dict | None, data: Any) -> tuple[Any, list[ResumeField] | None, str]:
    """(resume data, fields with values and errors, error of the whole-JSON box).

    Checked here, in words for the person filling the form: required fields (spaces alone are no
    answer), numbers, JSON (with line and column), and the simple limits of each field. The engine
    still validates the whole against the schema (``RESUME_DATA_INVALID``); its errors are put on
    their fields by ``attach_engine_errors``.
    """
    fields = build_fields(schema)
    if fields is None:
        raw = data.get("resume_data", "")
        try:
            return json.loads(raw), None, ""
        except json.JSONDecodeError as exc:
            return None, None, json_error(exc)
        except (ValueError, RecursionError):  # over-long integers, deep nesting
            return None, None, "This is not valid JSON: too deep or too large."
    result: dict[str, Any] = {}
    enums = {name: prop.get("enum", []) for name, prop in schema["properties"].items() if isinstance(prop, dict)}
    for f in fields:
        raw = data.get(f.input_name, "")
        f.value = raw if f.kind != "boolean" else ("on" if raw else "")
        if f.kind == "boolean":
            result[f.name] = bool(raw)
            continue
        if raw.strip() == "":  # spaces alone are no answer
            if f.required:
                f.error = REQUIRED[f.kind]
            continue
        if f.kind == "string":
            f.error = _string_problem(raw, f.schema)
            result[f.name] = raw
        elif f.kind in ("number", "integer"):
            try:
                number = int(raw) if f.kind == "integer" else float(raw)
            except ValueError:
                f.error = f"Enter {'a whole number' if f.kind == 'integer' else 'a number'}."
                continue
            f.error = _number_problem(number, f.schema)
            result[f.name] = number
        elif f.kind == "enum":
            try:
                result[f.name] = enums[f.name][int(raw)]
            except (ValueError, IndexError):
                f.error = "Choose one of the options."
        else:
            try:
                result[f.name] = json.loads(raw)
            except json.JSONDecodeError as exc:
                f.error = json_error(exc)
            except (ValueError, RecursionError):  # over-long integers, deep nesting
                f.error = "This is not valid JSON: too deep or too large."
    return result, fields, ""


REQUIRED = {
    "string": "Please write an answer (spaces alone do not count).",
    "number": "Please enter a number.",
    "integer": "Please enter a whole number.",
    "enum": "Please choose one.",
    "json": "Please fill this in (as JSON).",
}


def json_error(exc: json.JSONDecodeError) -> str:
    """Where JSON breaks, for a person: what is wrong, at which line and column."""
    return f"This is not valid JSON: {exc.msg.lower()} at line {exc.lineno}, column {exc.colno}."


def _string_problem(value: str, schema: dict) -> str:
    low, high = schema.get("minLength"), schema.get("maxLength")
    if isinstance(low, int) and len(value.strip()) < low:
        return f"Please write at least {low} character{'s' if low != 1 else ''}."
    if isinstance(high, int) and len(value) > high:
        return f"Please keep it to {high} character{'s' if high != 1 else ''} at most (now {len(value)})."
    pattern = schema.get("pattern")
    if isinstance(pattern, str):
        try:
            if re.search(pattern, value) is None:
                return "This does not have the expected form."
        except re.error:
            return ""  # the engine's validator has the last word
    return ""


def _number_problem(value: float, schema: dict) -> str:
    def limit(key: str) -> float | None:
        v = schema.get(key)
        return v if isinstance(v, int | float) and not isinstance(v, bool) else None

    if (low := limit("minimum")) is not None and value < low:
        return f"Please enter {low:g} or more."
    if (low := limit("exclusiveMinimum")) is not None and value <= low:
        return f"Please enter more than {low:g}."
    if (high := limit("maximum")) is not None and value > high:
        return f"Please enter {high:g} or less."
    if (high := limit("exclusiveMaximum")) is not None and value >= high:
        return f"Please enter less than {high:g}."
    return ""


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

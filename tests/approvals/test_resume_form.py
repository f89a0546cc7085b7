"""The Resume form speaks to the person filling it: per field, in plain words, JSON errors located."""

from __future__ import annotations

from approvals.resume_form import attach_engine_errors, parse_resume_form

SCHEMA = {
    "type": "object",
    "properties": {
        "answer": {"type": "string", "title": "Answer", "minLength": 2, "maxLength": 5},
        "note": {"type": "string"},
        "count": {"type": "integer", "minimum": 1},
        "extra": {"type": "object"},
    },
    "required": ["answer", "count"],
}


def errors(form: dict) -> dict[str, str]:
    _, fields, _ = parse_resume_form(SCHEMA, form)
    return {f.name: f.error for f in fields if f.error}


def test_spaces_alone_do_not_answer_a_required_string():
    assert errors({"resume__answer": "   ", "resume__count": "1"}) == {
        "answer": "Please write an answer (spaces alone do not count)."
    }


def test_limits_are_said_per_field():
    found = errors({"resume__answer": "toolong", "resume__count": "0", "resume__extra": '{"a": 1,\n "b" 2}'})
    assert found["answer"] == "Please keep it to 5 characters at most (now 7)."
    assert found["count"] == "Please enter 1 or more."
    assert found["extra"] == "This is not valid JSON: expecting ':' delimiter at line 2, column 6."


def test_a_valid_form_gives_the_data_and_optional_blanks_are_left_out():
    data, fields, error = parse_resume_form(
        SCHEMA, {"resume__answer": "ok", "resume__note": "  ", "resume__count": "3"}
    )
    assert (data, error) == ({"answer": "ok", "count": 3}, "")
    assert not any(f.error for f in fields)


def test_a_whole_json_box_names_line_and_column():
    _, _, error = parse_resume_form({"type": "array"}, {"resume_data": "[1,\n2,,]"})
    assert error == "This is not valid JSON: expecting value at line 2, column 3."


def test_engine_errors_land_on_their_fields():
    _, fields, _ = parse_resume_form(SCHEMA, {"resume__answer": "ok", "resume__count": "3"})
    loose = attach_engine_errors(
        fields, [{"loc": "answer", "message": "must be lowercase"}, {"loc": "$", "message": "x"}]
    )
    assert [f.error for f in fields if f.name == "answer"] == ["must be lowercase"] and loose == ["x"]

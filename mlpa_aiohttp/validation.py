"""The 422 wire shape, in one place: `{"detail": [{"loc": [...], "msg": ..., "type": ...}]}`.

The reference answers FastAPI's defaults, and FastAPI's 422 items are pydantic's validation
errors. So the request models (`models.py`) are pydantic models and this module turns
their `ValidationError`s into the wire items; nothing else builds an item by hand.

Two items pydantic does not produce, because FastAPI builds them before validating:

* a body that is not JSON: `json_invalid` at `["body", <position>]`;
* an empty body where one is required: `missing` at `["body"]`.

Each item carries `loc`, `msg` and `type` only (the pinned wire bodies): pydantic's
`input` would echo client values, message content included, into the response.
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from .wire import JsonSyntaxError, decode_json

Problem = dict[str, Any]
Model = TypeVar("Model", bound=BaseModel)

# Where a value came from, as the first element of `loc`.
BODY, HEADER, QUERY = "body", "header", "query"

# The OpenAPI description of an item and of the whole body (`openapi/__init__.py`).
VALIDATION_ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "loc": {"type": "array", "items": {"oneOf": [{"type": "string"}, {"type": "integer"}]}},
        "msg": {"type": "string"},
        "type": {"type": "string"},
    },
    "required": ["loc", "msg", "type"],
}


def _problem(loc: tuple[str | int, ...], msg: str, type_: str) -> Problem:
    return {"loc": list(loc), "msg": msg, "type": type_}


def body_missing() -> Problem:
    """FastAPI's item for a required body that is empty."""
    return _problem((BODY,), "Field required", "missing")


def json_invalid(position: int) -> Problem:
    """FastAPI's item for a body that is not JSON; `position` is where decoding stopped."""
    return _problem((BODY, position), "JSON decode error", "json_invalid")


def validate(model: type[Model], value: Any, source: str, problems: list[Problem]) -> Model | None:
    """`value` as `model`, or None with pydantic's errors appended to `problems` under `source`.

    `from_attributes=True` is how FastAPI validates a body: a JSON value that is not an
    object is `model_attributes_type` ("... or object to extract fields from"). JSON
    values carry no attributes, so nothing else changes.
    """
    try:
        return model.model_validate(value, from_attributes=True)
    except ValidationError as exc:
        problems.extend(
            _problem((source, *error["loc"]), error["msg"], error["type"])
            for error in exc.errors(include_url=False, include_context=False, include_input=False)
        )
        return None


def validate_json_body(model: type[Model], raw: bytes, problems: list[Problem]) -> Model | None:
    """The request body decoded (`wire.decode_json`, whose 400 propagates) and validated."""
    try:
        payload = decode_json(raw)
    except JsonSyntaxError as exc:
        problems.append(json_invalid(exc.position))
        return None
    return validate(model, payload, BODY, problems)

"""Schemathesis over the service's own `/openapi.json`: every documented operation, with
generated (mostly invalid) credentials and with valid ones, schema-conforming and
schema-violating data. No 5xx, no ERROR log line, and every answer conforms to the
documented status codes, content types and bodies."""

from __future__ import annotations

import pytest
import requests
import schemathesis
from hypothesis import given, strategies as st
from schemathesis.generation import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from schemathesis.checks import not_a_server_error

from mlpa_aiohttp.openapi import build_document

from .conftest import fuzz_settings
from .live_service import LiveService

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
# Every documented operation but the document itself, which schemathesis leaves out when
# it loads the schema from that URL.
OPERATIONS = sorted(
    (method.upper(), path)
    for path, item in build_document(mock_routes=True)["paths"].items()
    for method in item
    if path != "/openapi.json"
)


@pytest.fixture(scope="module")
def schema(live: LiveService) -> schemathesis.BaseSchema:
    return schemathesis.openapi.from_url(live.base_url + "/openapi.json")


@pytest.fixture(scope="module")
def session() -> requests.Session:
    with requests.Session() as opened:
        yield opened


def test_every_documented_operation_is_fuzzed(schema: schemathesis.BaseSchema) -> None:
    served = sorted(
        (result.ok().method.upper(), result.ok().path) for result in schema.get_all_operations()
    )
    assert served == OPERATIONS


@pytest.mark.parametrize("credentials", ["generated", "valid"])
@pytest.mark.parametrize("method,path", OPERATIONS)
def test_operation_never_5xx_and_conforms(
    schema: schemathesis.BaseSchema,
    live: LiveService,
    session: requests.Session,
    no_new_errors: None,
    method: str,
    path: str,
    credentials: str,
) -> None:
    operation = schema[path][method]
    cases = st.one_of(operation.as_strategy(GenerationMode.POSITIVE), operation.as_strategy(GenerationMode.NEGATIVE))

    @fuzz_settings(25)
    @given(case=cases)
    def exchange(case: schemathesis.Case) -> None:
        headers = live.valid_headers() if credentials == "valid" else None
        response = case.call(base_url=live.base_url, session=session, headers=headers, timeout=30)
        case.validate_response(response, checks=CHECKS, headers=headers)

    exchange()


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/mock/chat/completions", "/mock/chat/completions_no_auth"])
def test_streamed_answers_conform_to_the_documented_events(
    schema: schemathesis.BaseSchema, live: LiveService, session: requests.Session, no_new_errors: None, path: str
) -> None:
    # Found by the long run before the document described SSE events: every streamed
    # event is checked against the schema, so the default run pins it explicitly.
    operation = schema[path]["POST"]
    headers = {**live.valid_headers(), "service-type": "ai"}
    case = operation.Case(body={"model": "gpt-oss-120b", "stream": True, "messages": [{"role": "user", "content": "hi"}]}, headers=headers)
    response = case.call(base_url=live.base_url, session=session, timeout=30)
    assert response.status_code == 200 and response.headers["content-type"][0].startswith("text/event-stream")
    case.validate_response(response, checks=CHECKS, headers=headers)

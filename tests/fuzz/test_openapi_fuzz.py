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

from mlpa_aiohttp import keys
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


# aiohttp's own limits on a request line and on a header (`max_line_size`,
# `max_field_size`): beyond them the HTTP server answers 400 text/plain before any route
# runs, on every operation alike (found by the long run: a query of many long values).
HTTP_LINE_LIMIT = 8190


def beyond_http_limits(response: schemathesis.Response) -> bool:
    sent = response.request
    target = sent.path_url.encode("ascii", "replace") if sent.path_url else b""
    too_long = len(target) + len(b"GET  HTTP/1.1") > HTTP_LINE_LIMIT or any(
        len(str(name)) + len(str(value)) + 2 > HTTP_LINE_LIMIT for name, value in sent.headers.items()
    )
    if not too_long:
        return False
    assert response.status_code == 400, response.status_code
    assert response.headers["content-type"][0].startswith("text/plain")
    return True


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
        if beyond_http_limits(response):
            return
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


def test_a_request_line_beyond_aiohttps_limit_is_its_plain_400(
    schema: schemathesis.BaseSchema, live: LiveService, session: requests.Session, no_new_errors: None
) -> None:
    case = schema["/user"]["GET"].Case(query={"offset": "9" * HTTP_LINE_LIMIT})
    response = case.call(base_url=live.base_url, session=session, headers=live.valid_headers(), timeout=30)
    assert beyond_http_limits(response)
    counted = live.app[keys.METRICS].registry.get_sample_value("mlpa_bad_http_requests_total", {"reason": "LineTooLong"})
    assert counted is not None and counted >= 1

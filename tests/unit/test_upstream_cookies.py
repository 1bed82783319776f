"""The shared upstream session keeps no cookies: one it is sent for one user's request is
never replayed on another user's (or anyone's) later request."""

from __future__ import annotations

from ..conftest import ServiceFactory


async def test_a_cookie_litellm_sets_for_one_user_never_reaches_another(
    make_service: ServiceFactory, fake_litellm_server
) -> None:
    _, server = fake_litellm_server
    # A host name, not 127.0.0.1: aiohttp's default jar ignores cookies from IP addresses,
    # so only a name shows whether the session would keep them.
    service = await make_service(LITELLM_API_BASE=f"http://localhost:{server.port}")
    service.litellm.response_headers["Set-Cookie"] = "litellm_session=first-user; Path=/"
    first = await service.chat()
    assert first.status == 200 and first.headers.get("Set-Cookie") is None
    await first.read()
    seen_before_second = len(service.litellm.requests)
    del service.litellm.response_headers["Set-Cookie"]

    other_user = service.headers(authorization=f"Bearer {service.fxa.issue_jwt('second-uid')}")
    second = await service.chat(headers=other_user)
    assert second.status == 200
    await second.read()

    chats = service.litellm.requests_to("/v1/chat/completions")
    assert len(chats) == 2
    later = list(service.litellm.requests)[seen_before_second:]
    assert later and all("cookie" not in request.headers for request in later), [r.headers.get("cookie") for r in later]

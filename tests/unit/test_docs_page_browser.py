"""`/api/docs` in a real headless Chromium: Swagger UI reads the served OpenAPI 3.1
document and renders every operation, loading nothing but this app's own URLs.

A screenshot is left in the test's tmp directory (`docs-page.png`). Skipped with one line
where Chromium is not installed.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from mlpa_aiohttp.openapi import build_document

from ..browser import chromium_page
from ..conftest import Service

HTTP_METHODS = ("get", "put", "post", "delete", "patch", "options", "head", "trace")

RENDERED = """(() => ({
  error: [...document.querySelectorAll('.errors-wrapper, .loading-container .errors, .version-pragma')]
    .map((node) => node.textContent.trim()).join(' | '),
  title: document.querySelector('.info .title')?.textContent.trim() ?? null,
  version: document.querySelector('.info .title .version')?.textContent.trim() ?? null,
  operations: [...document.querySelectorAll('.opblock')].map((block) => ({
    method: block.querySelector('.opblock-summary-method')?.textContent.trim().toLowerCase(),
    path: block.querySelector('.opblock-summary-path')?.getAttribute('data-path'),
  })),
}))()"""


async def test_docs_page_renders_every_operation_offline(service: Service, tmp_path: Path) -> None:
    document = build_document(mock_routes=False)
    expected = sorted(
        (method, path) for path, item in document["paths"].items() for method in item if method in HTTP_METHODS
    )
    assert document["openapi"].startswith("3.1"), "the test is about a 3.1 document"
    docs_url = str(service.client.make_url("/api/docs"))

    async with chromium_page() as page:
        await page.call("Page.navigate", url=docs_url)
        # Done when every operation is drawn, or Swagger UI shows its "Unable to render" box.
        await page.wait_for(
            f"document.querySelectorAll('.opblock').length >= {len(expected)}"
            " || !!document.querySelector('.errors-wrapper, .loading-container .errors, .version-pragma')"
        )
        rendered = await page.evaluate(RENDERED)
        shot = await page.screenshot(tmp_path / "docs-page.png")

    assert rendered["error"] == ""
    assert rendered["title"] is not None and document["info"]["title"] in rendered["title"]
    assert sorted((op["method"], op["path"]) for op in rendered["operations"]) == expected
    assert shot.stat().st_size > 10_000
    origin = urlsplit(docs_url).netloc
    # data: URLs are the stylesheet's inline icons, not fetches.
    fetched = [url for url in page.requested_urls if urlsplit(url).scheme != "data"]
    foreign = [url for url in fetched if urlsplit(url).netloc != origin]
    assert fetched and not foreign, foreign
    print(f"screenshot: {shot}")

"""`GET /openapi.json` and Swagger UI at `GET /api/docs` (spec §1.10).

Swagger UI's files come from the `swagger-ui-bundle` package and are served by this app
under `/api/docs/static/`, so the docs page loads nothing from a CDN.
"""

from __future__ import annotations

import json

from aiohttp import web
from swagger_ui_bundle import swagger_ui_path

from .. import keys
from ..openapi import build_document

DOCS_PATH = "/api/docs"
STATIC_PREFIX = "/api/docs/static"
OPENAPI_PATH = "/openapi.json"

_SWAGGER_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
  <meta charset="utf-8">
  <title>MLPA API docs</title>
  <link rel="stylesheet" href="{static}/swagger-ui.css">
  <link rel="icon" type="image/png" href="{static}/favicon-32x32.png">
</head>
<body>
  <div id="swagger-ui"></div>
  <script src="{static}/swagger-ui-bundle.js"></script>
  <script src="{static}/swagger-ui-standalone-preset.js"></script>
  <script>
    window.ui = SwaggerUIBundle({{
      url: "{openapi}",
      dom_id: "#swagger-ui",
      presets: [SwaggerUIBundle.presets.apis, SwaggerUIStandalonePreset],
      layout: "StandaloneLayout"
    }});
  </script>
</body>
</html>
"""


def setup_docs_routes(app: web.Application) -> None:
    document = build_document(mock_routes=app[keys.SETTINGS].server.mock_routes)
    # Serialised once: the document only changes with the code and the mock switch.
    document_body = json.dumps(document).encode()
    page = _SWAGGER_PAGE.format(static=STATIC_PREFIX, openapi=OPENAPI_PATH)

    async def openapi_json(request: web.Request) -> web.Response:
        return web.Response(body=document_body, content_type="application/json")

    async def swagger_ui(request: web.Request) -> web.Response:
        return web.Response(text=page, content_type="text/html")

    app.router.add_get(OPENAPI_PATH, openapi_json)
    app.router.add_get(DOCS_PATH, swagger_ui)
    app.router.add_static(STATIC_PREFIX, swagger_ui_path)

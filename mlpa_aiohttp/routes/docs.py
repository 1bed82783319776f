"""`GET /openapi.json` and Swagger UI at `GET /api/docs` (compatibility.md §1.10).

The document is OpenAPI 3.1, which Swagger UI reads from 5.0 on. Its files come from the
`flask-swagger-ui` wheel, whose version follows Swagger UI's own releases (the older
`swagger-ui-bundle` stopped at 4.15, which cannot read 3.1). Only the wheel's `dist/`
folder is used: it is located without importing the package, so Flask is never loaded.
This app serves those files under `/api/docs/static/`, so the page needs no CDN.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from aiohttp import web

from .. import keys
from ..openapi import build_document

DOCS_PATH = "/api/docs"
STATIC_PREFIX = "/api/docs/static"
OPENAPI_PATH = "/openapi.json"

# The inline script is ours; `validatorUrl: null` keeps Swagger UI from asking the public
# validator about the document (the page then loads nothing but this app's own URLs).
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
      layout: "StandaloneLayout",
      validatorUrl: null
    }});
  </script>
</body>
</html>
"""


def swagger_ui_dist() -> Path:
    """The folder of Swagger UI's built files inside the installed `flask-swagger-ui`."""
    spec = importlib.util.find_spec("flask_swagger_ui")  # finds it without running its __init__
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("flask-swagger-ui is not installed; it provides the files of /api/docs")
    return Path(next(iter(spec.submodule_search_locations))) / "dist"


def setup_docs_routes(app: web.Application) -> None:
    settings = app[keys.SETTINGS]
    document = build_document(mock_routes=settings.server.mock_routes, catalog=settings.catalog)
    # Serialised once: the document only changes with the code, the catalogue and the mock switch.
    document_body = json.dumps(document).encode()
    page = _SWAGGER_PAGE.format(static=STATIC_PREFIX, openapi=OPENAPI_PATH)

    async def openapi_json(request: web.Request) -> web.Response:
        return web.Response(body=document_body, content_type="application/json")

    async def swagger_ui(request: web.Request) -> web.Response:
        return web.Response(text=page, content_type="text/html")

    app.router.add_get(OPENAPI_PATH, openapi_json)
    app.router.add_get(DOCS_PATH, swagger_ui)
    app.router.add_static(STATIC_PREFIX, swagger_ui_dist())

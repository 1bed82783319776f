"""Names of the non-standard HTTP headers the service reads or sends, each written once.

Standard headers are aiohttp's `hdrs` constants. These are the wire names the Firefox
clients, the admin page, the CDN edge and Google use (compatibility.md §1.1, §1.6, §2.6);
header lookups are case-insensitive, the spelling here is the one documented.
"""

from __future__ import annotations

# The proxy routes (compatibility.md §1.1).
SERVICE_TYPE = "service-type"
PURPOSE = "purpose"
DEV_AUTHORIZATION = "x-dev-authorization"
USE_APP_ATTEST = "use-app-attest"
USE_QA_CERTIFICATES = "use-qa-certificates"
USE_PLAY_INTEGRITY = "use-play-integrity"
GEO_COUNTRY = "X-Geo-Country"
SESSION_ID = "session-id"
# A client's own LiteLLM key, honoured with ALLOW_CUSTOM_VIRTUAL_KEY (MLPA 1.0.39, compatibility.md §4.2).
LITELLM_VIRTUAL_KEY = "litellm-virtual-key"
# A client opts its stream into keep-alive lines with this one (compatibility.md D34).
STREAM_KEEPALIVE = "X-MLPA-Keepalive"

# The admin keys: the reference's underscored spelling first, then the hyphenated one that
# proxies keep (compatibility.md D12).
MASTER_KEY = ("master_key", "master-key")
UI_ACCESS_KEY = ("mlpa_ui_access_key", "mlpa-ui-access-key")

# Google's quota-project header on the Play Integrity call (compatibility.md §2.6).
GOOGLE_USER_PROJECT = "x-goog-user-project"

# The request id a caller (or the edge) may pass, echoed in every log line.
REQUEST_ID = "x-request-id"
# Tells nginx-style intermediaries not to buffer a stream.
ACCEL_BUFFERING = "X-Accel-Buffering"

# Standard, but not in the `hdrs` of aiohttp 3.14.0, the lowest version setup.cfg admits.
CONTENT_SECURITY_POLICY = "Content-Security-Policy"
STRICT_TRANSPORT_SECURITY = "Strict-Transport-Security"
CONTENT_TYPE_OPTIONS = "X-Content-Type-Options"

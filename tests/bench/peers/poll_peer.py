"""FastAPI peer that polls `request.is_disconnected()` every 100 ms per stream.

    uvicorn tests.bench.peers.poll_peer:app --workers 1
"""

from .fastapi_relay import make_app, poll_until_disconnected

app = make_app(poll_until_disconnected)

"""FastAPI peer that awaits `request.receive()` until `http.disconnect`, per stream.

    uvicorn tests.bench.peers.receive_peer:app --workers 1
"""

from .fastapi_relay import make_app, receive_until_disconnected

app = make_app(receive_until_disconnected)

"""The receive() peer without the original's stack: a bare FastAPI relay, no middlewares,
no chunk inspection, no metrics.

    uvicorn tests.bench.peers.receive_bare_peer:app --workers 1
"""

from .fastapi_relay import make_app, receive_until_disconnected

app = make_app(receive_until_disconnected, with_reference_stack=False)

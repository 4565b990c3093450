"""The HTTP edge: the FastAPI app, auth, the request gate, the wire models, routes, status, metrics and the page."""

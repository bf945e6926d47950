"""The ASGI shell: the :class:`~admitgate.asgi.middleware.AdmitGate` middleware, route matching (Starlette's path
compiler), client identity and retry tickets, response headers, CORS, start-up checks and worker detection.
"""

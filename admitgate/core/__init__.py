"""The framework-free core: the token pacer, the Retry-After schedule, the gate's admit/pace/reject decision,
priority classes and rules, settings, fair shares, retry delays, clocks and errors. It imports no ASGI
framework, Redis or Prometheus client (tests/test_architecture.py holds it to that).
"""

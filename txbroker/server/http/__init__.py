"""The broker's HTTP port: the admin API, publishing and two-phase messages over JSON, and the
OpenAPI document of the latter (docs/http-api.md, docs/operations.md)."""

from txbroker.server.http.app import build_http_app
from txbroker.server.http.messaging import tcp_requests
from txbroker.server.http.problems import Problem, ProblemBody

__all__ = [
    # the app
    "build_http_app",
    "tcp_requests",
    # errors
    "Problem",
    "ProblemBody",
]

"""Tests serve ASGI apps with the project's own helper (real HTTP on a free local port)."""

from txbroker.runtime.httpserve import serving as serve_app

__all__ = ["serve_app"]

"""A service's connection settings: what its code passes, else the ``TXB_*`` environment
variables the CLI reads (the same names: a shell or a container set up for one works for the
other), else the defaults. Read once, when the service object is made.

    settings = ServiceSettings.resolve(os.environ, server=None, auth_token=None, ...)
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from txbroker_sdk.requests import is_nameserver_url, uses_tls

__all__ = [
    "AUTH_TOKEN",
    "CHECK_SECRET",
    "DATABASE_URL",
    "DEFAULT_SERVER",
    "SERVER",
    "TLS_CA",
    "TLS_CLIENT_CERT",
    "TLS_CLIENT_KEY",
    "ServiceSettings",
]

log = logging.getLogger(__name__)

SERVER: Final = "TXB_SERVER"
AUTH_TOKEN: Final = "TXB_AUTH_TOKEN"
TLS_CA: Final = "TXB_TLS_CA"
TLS_CLIENT_CERT: Final = "TXB_TLS_CLIENT_CERT"
TLS_CLIENT_KEY: Final = "TXB_TLS_CLIENT_KEY"
DATABASE_URL: Final = "TXB_DATABASE_URL"
CHECK_SECRET: Final = "TXB_CHECK_SECRET"  # the producer group's, which the broker holds too
DEFAULT_SERVER: Final = "txb://127.0.0.1:9876"
# The name the examples once read the broker's address from: still read when TXB_SERVER is not
# set (a deployment made for them keeps its broker rather than reaching for the default), with a
# warning naming the variable to set instead.
_OLD_SERVER: Final = "TXB_URL"


@dataclass(frozen=True, slots=True)
class ServiceSettings:
    server: str
    database: str | None
    auth_token: str | None = field(repr=False)
    tls_ca: str | None
    tls_cert: str | None
    tls_key: str | None
    check_secret: str | None = field(repr=False)

    @classmethod
    def resolve(
        cls,
        env: Mapping[str, str],
        *,
        server: str | None,
        database: str | None,
        auth_token: str | None,
        tls_ca: str | None,
        tls_cert: str | None,
        tls_key: str | None,
        check_secret: str | None,
    ) -> ServiceSettings:
        """Each setting from its argument, else its variable (an empty one counts as unset,
        as for the CLI). The TLS variables apply to a ``txbs://`` server or NameServers only, as
        for the CLI: a plain broker refuses TLS files, and a shell set up for another broker may
        hold them."""

        def pick(given: str | None, name: str) -> str | None:
            return given if given is not None else (env.get(name) or None)

        url = pick(server, SERVER)
        if url is None and env.get(_OLD_SERVER):
            url = env[_OLD_SERVER]
            log.warning(
                "the broker's address is read from %s, the old name of %s (the CLI's): "
                "set %s instead",
                _OLD_SERVER,
                SERVER,
                SERVER,
            )
        url = url or DEFAULT_SERVER
        tls = uses_tls(url) or is_nameserver_url(url)  # NameServers may route to TLS brokers

        def pick_tls(given: str | None, name: str) -> str | None:
            return pick(given, name) if tls else given

        return cls(
            server=url,
            database=pick(database, DATABASE_URL),
            auth_token=pick(auth_token, AUTH_TOKEN),
            tls_ca=pick_tls(tls_ca, TLS_CA),
            tls_cert=pick_tls(tls_cert, TLS_CLIENT_CERT),
            tls_key=pick_tls(tls_key, TLS_CLIENT_KEY),
            check_secret=pick(check_secret, CHECK_SECRET),
        )

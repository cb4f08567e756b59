"""TLS contexts for both sides of the wire (Python's ``ssl``), built once at start.

The broker serves TLS on its TCP and HTTP listeners with ``server_context`` (a certificate chain
and its key; with a client CA, mutual TLS: a client must present a certificate that CA signed).
The SDK connects with ``client_context`` when the broker's URL is ``txbs://``: the server's
certificate is verified against the given CA file (or the system's trust store) and must name
the host of the URL. TLS 1.2 is the oldest version either side accepts.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from txbroker.errors import InvalidArgument

__all__ = ["TLS_HANDSHAKE_RECORD", "TlsFiles", "client_context", "server_context"]

# The first byte of every TLS connection: a handshake record (the ClientHello). A client that
# starts with anything else is not speaking TLS (a txbroker frame starts with a length).
TLS_HANDSHAKE_RECORD: Final = 0x16


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """A listener's certificate chain and key (PEM), and optionally the CA of its clients."""

    cert: Path
    key: Path
    client_ca: Path | None = None


def server_context(files: TlsFiles) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(files.cert, files.key)
        if files.client_ca is not None:
            ctx.load_verify_locations(cafile=files.client_ca)
            ctx.verify_mode = ssl.CERT_REQUIRED
    except (OSError, ssl.SSLError) as e:
        # The broker's and the NameServer's listeners both load theirs here: name the flags.
        raise InvalidArgument(
            f"cannot load the listener's TLS files (--tls-cert, --tls-key, --tls-client-ca): {e}"
        ) from e
    return ctx


def client_context(
    ca: str | Path | None = None, cert: str | Path | None = None, key: str | Path | None = None
) -> ssl.SSLContext:
    """A client's context: verifies the broker against ``ca`` (default: the system's CAs) and
    presents ``cert``/``key`` when the broker asks for a client certificate (mutual TLS)."""
    try:
        ctx = ssl.create_default_context(cafile=ca)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        if cert is not None:
            ctx.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as e:
        raise InvalidArgument(f"cannot load the client's TLS files: {e}") from e
    return ctx

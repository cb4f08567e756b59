"""A CA and certificates for TLS tests, made by the ``openssl`` command line in a directory of
the test's: a server certificate for 127.0.0.1 and localhost, a client certificate, and a second
CA that signed nothing here (a client or slave trusting it trusts no one of ours)."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Final

__all__ = ["OPENSSL_MISSING", "Pki", "make_pki"]

OPENSSL_MISSING: Final = shutil.which("openssl") is None


@dataclass(frozen=True)
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path  # a CA that signed nothing here


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _ca(d: Path, name: str) -> None:
    _openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", f"{name}.key", "-out", f"{name}.pem", "-days", "2", "-subj", f"/CN={name}",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        cwd=d,
    )  # fmt: skip


def _leaf(d: Path, name: str, ext: str) -> None:
    (d / f"{name}.ext").write_text(ext)
    _openssl(
        "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}",
        cwd=d,
    )  # fmt: skip
    _openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext",
        cwd=d,
    )  # fmt: skip


def make_pki(d: Path) -> Pki:
    """The CA ``ca``, the CA ``other`` and the leaf certificates, in ``d``."""
    _ca(d, "ca")
    _ca(d, "other")
    _leaf(d, "server", "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n")
    _leaf(d, "client", "extendedKeyUsage=clientAuth\n")
    return Pki(
        d / "ca.pem", d / "server.pem", d / "server.key", d / "client.pem", d / "client.key",
        d / "other.pem",
    )  # fmt: skip

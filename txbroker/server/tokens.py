"""Who a token is: the broker's table of tokens, each with a name, roles and topic patterns.

A token is stored as its SHA-256 digest only, and a presented token is hashed and compared with
every entry in constant time, so neither the table in memory nor the time an answer takes says
which token is near. Tokens are long random strings: a plain hash (not a slow password hash) is
enough, and costs a connection nothing worth measuring. Roles (:class:`Role`; docs/operations.md,
"Access control"): produce, consume, read, admin. Topic patterns are case-sensitive ``fnmatch``
globs (``orders.*``); a token without ``topics`` has ``["*"]``. The single ``auth_token``
setting is the token named ``admin`` with the admin role on ``*``.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any, Final

from txbroker.errors import InvalidArgument

__all__ = ["ANYONE", "Principal", "Role", "TokenEntry", "TokenTable", "parse_tokens"]

# A name shows in logs and errors in place of the token: short and plain.
NAME_CHARS_MAX: Final = 64
# Patterns per token: a token is for a service or an operator, who names a few topic families.
TOPICS_MAX: Final = 256
_ENTRY_KEYS: Final = frozenset({"name", "token", "token_sha256", "roles", "topics"})


class Role(enum.StrEnum):
    """What each role may do (docs/operations.md, "Access control")::

    produce   SEND, SEND_BATCH, TX_PREPARE, TX_END on the topics it names
    consume   HEARTBEAT, PULL, ACK, NACK, LEAVE, OFFSETS on the topics it names
    read      listings and descriptions: topics, groups and lag, transactions, dead letters,
              the HTTP admin API's GETs, /metrics, the console's pages
    admin     everything: the three above, plus topic create/delete, transaction resolve,
              dead-letter re-drive, the console's actions
    """

    PRODUCE = "produce"
    CONSUME = "consume"
    READ = "read"
    ADMIN = "admin"


# What admin implies: every other role.
_ALL_ROLES: Final = frozenset(Role)


@dataclass(frozen=True, slots=True)
class Principal:
    """What a connection (or an HTTP request) may do: its token's name, roles and topics."""

    name: str
    roles: frozenset[Role]
    topics: tuple[str, ...] = ("*",)

    @property
    def superuser(self) -> bool:
        """Admin on every topic: no request needs a check (the fast path)."""
        return Role.ADMIN in self.roles and "*" in self.topics

    def has(self, role: Role) -> bool:
        return role in self.roles or Role.ADMIN in self.roles

    def may(self, role: Role, topic: str | None) -> bool:
        """Whether this principal holds ``role`` on ``topic``; ``None`` means every topic (an
        action not bound to one, such as re-driving a group's dead letters), which needs the
        pattern ``*`` itself."""
        if not self.has(role):
            return False
        if topic is None:
            return "*" in self.topics
        return any(fnmatchcase(topic, p) for p in self.topics)

    def sees(self, topic: str, roles: Iterable[Role]) -> bool:
        """Whether ``topic`` belongs in a listing for this principal (any of ``roles`` on it)."""
        return any(self.may(r, topic) for r in roles)


# Everyone, on a broker without tokens.
ANYONE: Final = Principal("anyone", _ALL_ROLES)


@dataclass(frozen=True, slots=True)
class TokenEntry:
    """One token of the table: its digest (never the token) and what it grants."""

    principal: Principal
    digest: bytes = field(repr=False)  # SHA-256 of the token's UTF-8 bytes


class TokenTable:
    """The broker's tokens. Empty: no authentication at all (everyone is :data:`ANYONE`)."""

    def __init__(self, entries: Iterable[TokenEntry] = ()) -> None:
        self.entries: tuple[TokenEntry, ...] = tuple(entries)
        names = [e.principal.name for e in self.entries]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise InvalidArgument(f"token names must be unique; repeated: {sorted(dup)}")
        digests = [e.digest for e in self.entries]
        if len(set(digests)) != len(digests):
            raise InvalidArgument("two tokens of the table are the same token")

    @classmethod
    def build(cls, auth_token: str | None, tokens: Iterable[TokenEntry]) -> TokenTable:
        """The table of a broker's settings: the single ``auth_token`` (an admin token named
        ``admin``) and the ``[[tokens]]`` entries."""
        entries = list(tokens)
        if auth_token is not None:
            admin = Principal("admin", frozenset({Role.ADMIN}))
            entries.insert(0, TokenEntry(admin, _digest(auth_token)))
        return cls(entries)

    @property
    def required(self) -> bool:
        """Whether clients must present a token."""
        return bool(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def __repr__(self) -> str:
        return f"TokenTable({[e.principal.name for e in self.entries]})"

    def authenticate(self, token: str | None) -> Principal | None:
        """The principal of ``token``; None when it is missing or no entry's. Without tokens
        configured, everyone is :data:`ANYONE`."""
        if not self.entries:
            return ANYONE
        if not token:
            return None
        given = _digest(token)
        found: Principal | None = None
        for e in self.entries:  # all of them: the time taken does not depend on which matched
            if hmac.compare_digest(given, e.digest):
                found = e.principal
        return found


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def parse_tokens(raw: object, source: str) -> list[TokenEntry]:
    """The entries of a ``[[tokens]]`` array (a list of tables) read from ``source`` (named in
    errors). An error never quotes a token."""
    if not isinstance(raw, list) or not all(isinstance(e, Mapping) for e in raw):
        raise InvalidArgument(f"tokens in {source} must be an array of tables ([[tokens]])")
    return [_entry(e, i, source) for i, e in enumerate(raw)]


def _entry(e: Mapping[str, Any], i: int, source: str) -> TokenEntry:
    where = f"token #{i + 1} of {source}"
    unknown = set(e) - _ENTRY_KEYS
    if unknown:
        raise InvalidArgument(f"{where}: unknown keys {sorted(unknown)}")
    name = e.get("name")
    if not isinstance(name, str) or not 0 < len(name) <= NAME_CHARS_MAX or not name.isprintable():
        raise InvalidArgument(f"{where}: name must be 1..{NAME_CHARS_MAX} printable characters")
    where = f"token {name!r} of {source}"
    token, hexdigest = e.get("token"), e.get("token_sha256")
    if (token is None) == (hexdigest is None):
        raise InvalidArgument(f"{where}: give exactly one of token and token_sha256")
    if token is not None:
        if not isinstance(token, str) or not token:
            raise InvalidArgument(f"{where}: token must be a non-empty string")
        digest = _digest(token)
    else:
        try:
            digest = bytes.fromhex(hexdigest) if isinstance(hexdigest, str) else b""
        except ValueError:
            digest = b""
        if len(digest) != hashlib.sha256().digest_size:
            raise InvalidArgument(f"{where}: token_sha256 must be 64 hex digits")
    roles = e.get("roles")
    if not isinstance(roles, list) or not roles:
        raise InvalidArgument(f"{where}: roles must be a non-empty list")
    try:
        granted = frozenset(Role(r) for r in roles)
    except ValueError:
        raise InvalidArgument(
            f"{where}: roles must be among {[r.value for r in Role]}, got {roles!r}"
        ) from None
    topics = e.get("topics", ["*"])
    if (
        not isinstance(topics, list)
        or not 0 < len(topics) <= TOPICS_MAX
        or not all(isinstance(t, str) and t for t in topics)
    ):
        raise InvalidArgument(f"{where}: topics must be a list of 1..{TOPICS_MAX} patterns")
    return TokenEntry(Principal(name, granted, tuple(topics)), digest)

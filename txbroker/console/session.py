"""Console sessions: a signed cookie instead of a token in every request.

A browser cannot send ``Authorization: Bearer`` by itself, so an operator signs in once with a
broker token and gets a signed session cookie; the broker keeps no session table, so changing or
removing tokens ends their sessions. Without tokens every visitor gets an anonymous session,
only so the forms' CSRF tokens have something to be bound to (who may act: ``guard.py``).
:class:`Sessions` gives the cookie's layout, keys and lifetimes.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from txbroker.server.tokens import Principal, TokenTable

__all__ = ["COOKIE", "FLASH_COOKIE", "SESSION_TTL_S", "Session", "Sessions"]

COOKIE: Final = "txb_console"
FLASH_COOKIE: Final = "txb_console_flash"
# A working day: long enough not to interrupt an incident, short enough that a cookie left on
# a shared machine stops working by the next one.
SESSION_TTL_S: Final = 12 * 3600
# Failed sign-ins accepted per minute over the whole broker (then 429): a token cannot be
# guessed online, and an operator who mistypes a few times is not locked out.
FAILED_LOGINS_PER_MIN: Final = 10
_KEY_CONTEXT: Final = b"txbroker console session v1"


@dataclass(frozen=True, slots=True)
class Session:
    sid: str
    expires_s: int
    signed_in: bool  # True: made by signing in with a token; False: anonymous (no tokens)
    who: Principal | None = None  # the token signed in with

    @property
    def name(self) -> str:
        return self.who.name if self.who is not None else ""


class Sessions:
    """The console's sessions, CSRF tokens and notices, all signed; no table of them is kept.

    An operator signs in with a token of the broker (``tokens.py``; one with the read or admin role
    on every topic) and gets a session cookie ``txb_console`` (HttpOnly, SameSite=Strict, path
    ``/console``): ``<session id>.<expiry>.<token name, hex>.<HMAC>``, signed with a key derived
    from the digests of all the broker's tokens. Changing the tokens (a restart with others) ends
    every session, a token removed ends its sessions, and a session ends by itself after
    ``SESSION_TTL_S``. What a session may do is its token's roles, looked up by name.

    Without a token configured every visitor gets an anonymous session on the first page, signed
    with a key drawn at start (a restart ends them); who may act is decided in ``guard.py`` (from
    the broker's own host only).

    Each session has its CSRF token, an HMAC of its id: forms carry it, and a form whose token is
    not its session's is refused. Short notices after an action ("committed ...") travel in a
    signed cookie too, so a link cannot make the console say something it did not do.
    """

    def __init__(
        self,
        tokens: TokenTable | str | None,
        *,
        ttl_s: int = SESSION_TTL_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not isinstance(tokens, TokenTable):  # a string: the single admin token
            tokens = TokenTable.build(tokens, ())
        self.tokens = tokens
        self._by_name = {e.principal.name: e.principal for e in tokens.entries}
        self._ttl_s = ttl_s
        self._clock = clock
        if tokens.required:
            digests = b"".join(sorted(e.digest for e in tokens.entries))
            self._key = hmac.new(digests, _KEY_CONTEXT, hashlib.sha256).digest()
        else:
            self._key = secrets.token_bytes(32)
        self._failures: deque[float] = deque()

    @property
    def required(self) -> bool:
        """Whether a visitor must sign in (the broker has tokens)."""
        return self.tokens.required

    def _sign(self, payload: str) -> str:
        return hmac.new(self._key, payload.encode(), hashlib.sha256).hexdigest()

    # --- sessions ---

    def issue(self, who: Principal | None = None) -> tuple[str, Session]:
        """A new session (of the token ``who`` signed in with) and its cookie value."""
        sid = secrets.token_hex(16)
        expires = int(self._clock()) + self._ttl_s
        name = who.name if who is not None else ""
        payload = f"{sid}.{expires}.{name.encode().hex()}"
        return f"{payload}.{self._sign(payload)}", Session(sid, expires, self.required, who)

    def verify(self, cookie: str | None) -> Session | None:
        """The session a cookie holds, or None if it is missing, forged or expired."""
        if not cookie or len(cookie) > 400:
            return None
        payload, _, sig = cookie.rpartition(".")
        sid, expires, name_hex = [*payload.split("."), "", ""][:3]
        if (
            not sid
            or not expires.isdigit()
            or not hmac.compare_digest(sig.encode(), self._sign(payload).encode())
        ):
            return None
        if int(expires) <= self._clock():
            return None
        who = None
        if self.required:
            who = self._by_name.get(bytes.fromhex(name_hex).decode())
            if who is None:
                return None  # a token no longer configured
        return Session(sid, int(expires), self.required, who)

    def check_token(self, given: str) -> Principal | None:
        """The token ``given`` is (constant time, as on the wire); None without tokens."""
        if not self.required:
            return None
        return self.tokens.authenticate(given)

    def throttled(self) -> bool:
        """Whether too many sign-ins failed in the last minute."""
        now = self._clock()
        while self._failures and self._failures[0] < now - 60:
            self._failures.popleft()
        return len(self._failures) >= FAILED_LOGINS_PER_MIN

    def failed(self) -> None:
        self._failures.append(self._clock())

    # --- CSRF ---

    def csrf_token(self, session: Session) -> str:
        return self._sign(f"csrf:{session.sid}")

    def csrf_ok(self, session: Session, given: object) -> bool:
        if not isinstance(given, str):
            return False
        return hmac.compare_digest(given.encode(), self.csrf_token(session).encode())

    # --- notices after an action ---

    def seal(self, kind: str, text: str) -> str:
        """A cookie value carrying one notice (``kind`` ok or error), signed."""
        raw = base64.urlsafe_b64encode(f"{kind}\n{text}".encode()).decode()
        return f"{raw}.{self._sign('flash:' + raw)}"

    def unseal(self, value: str | None) -> tuple[str, str] | None:
        if not value or len(value) > 4096:
            return None
        raw, _, sig = value.partition(".")
        if not hmac.compare_digest(sig.encode(), self._sign("flash:" + raw).encode()):
            return None
        try:
            kind, _, text = base64.urlsafe_b64decode(raw).decode().partition("\n")
        except ValueError:
            return None
        return kind, text

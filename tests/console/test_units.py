"""The console's pure parts: where a request comes from, session cookies, trace ids."""

from __future__ import annotations

from starlette.requests import Request

from txbroker.console.guard import cross_site, local_only
from txbroker.console.session import Sessions
from txbroker.console.timeline import trace_id_of


def _request(peer: str, host: str, **headers: str) -> Request:
    raw = [(b"host", host.encode())] + [
        (k.replace("_", "-").encode(), v.encode()) for k, v in headers.items()
    ]
    scope = {"type": "http", "method": "POST", "path": "/console/x", "headers": raw,
             "client": (peer, 50000), "scheme": "http", "server": ("127.0.0.1", 9877),
             "query_string": b""}  # fmt: skip
    return Request(scope)


def test_only_loopback_peers_naming_a_loopback_host_count_as_this_host() -> None:
    for peer, host in (("127.0.0.1", "127.0.0.1:9877"), ("::1", "[::1]:9877"),
                       ("127.0.0.1", "localhost:9877"), ("127.0.0.2", "LOCALHOST")):  # fmt: skip
        assert local_only(_request(peer, host)) is None, (peer, host)
    for peer, host in (("10.1.2.3", "127.0.0.1:9877"), ("127.0.0.1", "evil.example:9877"),
                       ("127.0.0.1", "broker.internal"), ("192.168.1.5", "localhost")):  # fmt: skip
        assert local_only(_request(peer, host)) is not None, (peer, host)


def test_same_origin_is_what_the_browser_says() -> None:
    assert cross_site(_request("127.0.0.1", "b:1")) is None  # not a browser: the CSRF token decides
    ok = _request("127.0.0.1", "b:1", origin="http://b:1", sec_fetch_site="same-origin")
    assert cross_site(ok) is None
    assert cross_site(_request("127.0.0.1", "b:1", origin="http://b:2")) is not None
    assert cross_site(_request("127.0.0.1", "b:1", origin="null")) is not None
    assert cross_site(_request("127.0.0.1", "b:1", sec_fetch_site="none")) is not None


def test_session_cookies_are_signed_expire_and_die_with_the_token() -> None:
    now = [1_000_000.0]
    s = Sessions("token-a", ttl_s=60, clock=lambda: now[0])
    cookie, session = s.issue(s.check_token("token-a"))
    assert s.verify(cookie) == session and session.signed_in
    sid, expires, name, sig = cookie.split(".")
    assert session.name == "admin" and bytes.fromhex(name) == b"admin"
    assert s.verify(f"{sid}.{int(expires) + 3600}.{name}.{sig}") is None  # a longer life, forged
    other = "1" if sid[-1] == "0" else "0"  # a different last digit, whatever the sid drew
    assert s.verify(f"{sid[:-1]}{other}.{expires}.{name}.{sig}") is None
    assert s.verify(f"{sid}.{expires}.{b'dashboard'.hex()}.{sig}") is None  # another token's
    assert Sessions("token-b", clock=lambda: now[0]).verify(cookie) is None
    assert s.csrf_ok(session, s.csrf_token(session))
    assert not s.csrf_ok(session, Sessions("token-a").csrf_token(s.issue()[1]))
    now[0] += 61
    assert s.verify(cookie) is None
    anonymous = Sessions(None)
    assert not anonymous.required and anonymous.check_token("") is None
    assert anonymous.verify(Sessions(None).issue()[0]) is None  # a key per process
    kind_text = s.unseal(s.seal("ok", "transaction t1 committed"))
    assert kind_text == ("ok", "transaction t1 committed")
    assert s.unseal(Sessions("token-b").seal("ok", "forged")) is None


def test_trace_ids_come_from_well_formed_traceparents_only() -> None:
    tid = "4bf92f3577b34da6a3ce929d0e0e4736"
    assert trace_id_of(f"00-{tid}-00f067aa0ba902b7-01") == tid
    for bad in (None, "", f"00-{tid}-00f067aa0ba902b7", f"00-{tid.upper()}-00f067aa0ba902b7-01",
                "00-" + "0" * 32 + "-00f067aa0ba902b7-01", f"ff-{tid}-00f067aa0ba902b7-01",
                '00-"><script>-x-01'):  # fmt: skip
        assert trace_id_of(bad) is None, bad

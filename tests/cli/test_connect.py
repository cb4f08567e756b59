"""What a broker command says when its address is wrong, against real processes: a closed port
(one line within --connect-timeout, each attempt only with -v), the broker's HTTP port (named,
with the TCP port), the TCP port asked in HTTP (answered in HTTP, naming the HTTP port), and an
auth token that a broker without tokens does not check (one warning)."""

from __future__ import annotations

import re
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from tests.conftest import BrokerProcess, free_port, run_cli
from txbroker_sdk.settings import AUTH_TOKEN, DEFAULT_SERVER, SERVER


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("connect") / "broker").start()
    yield b
    b.stop()


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def test_a_closed_port_fails_in_one_line_within_the_connect_timeout() -> None:
    port = free_port()  # nothing listens there
    started = time.monotonic()
    out = run_cli("topic", "list", "--server", f"txb://127.0.0.1:{port}")
    took = time.monotonic() - started
    assert out.returncode == 2 and out.stdout == ""
    [line] = out.stderr.splitlines()
    assert re.fullmatch(
        rf"txbroker: error \[BROKER_UNREACHABLE\]: cannot connect to 127\.0\.0\.1:{port} within "
        r"3 s \((\d+) attempts; is the broker running there\?\): \[Errno \d+\] Connection refused",
        line,
    ), line
    # 3 s of attempts and the interpreter's start, which a busy machine stretches to seconds;
    # not a service's default deadline of 10 s.
    assert 3.0 <= took < 10.0, took


def test_verbose_shows_each_attempt_and_the_timeout_is_a_flag() -> None:
    port = free_port()
    out = run_cli(
        "topic", "list", "--server", f"127.0.0.1:{port}", "--connect-timeout", "0.5", "-v"
    )
    assert out.returncode == 2
    *attempts, last = out.stderr.splitlines()
    m = re.fullmatch(
        r"txbroker: error \[BROKER_UNREACHABLE\]: .* within 0\.5 s \((\d+) attempts; .*", last
    )
    assert m is not None, last
    assert len(attempts) == int(m.group(1)) - 1 >= 2  # every attempt but the last one
    for n, line in enumerate(attempts, 1):
        assert line.startswith(f"txbroker: warning: broker 127.0.0.1:{port}: attempt {n} failed")
    once = run_cli("topic", "list", "--server", f"127.0.0.1:{port}", "--connect-timeout", "0")
    assert once.stderr.startswith(
        f"txbroker: error [BROKER_UNREACHABLE]: cannot connect to 127.0.0.1:{port}: "
    )


def test_the_http_port_is_named_with_the_tcp_port(broker: BrokerProcess) -> None:
    http, tcp = broker.http.removeprefix("http://"), _port(broker.url)
    started = time.monotonic()
    # A connect deadline far past a CLI's start-up even on a loaded machine: a retry would
    # take it, a wrong port answered at once does not.
    out = run_cli("topic", "list", "--server", f"txb://{http}", "--connect-timeout", "30")
    took = time.monotonic() - started
    assert out.returncode == 2
    assert out.stderr.splitlines() == [
        f"txbroker: error [WRONG_PORT]: {http} is the broker's HTTP port (it answered in HTTP: "
        f"HTTP/1.1 400 Bad Request); the TCP port is {tcp}: txb://127.0.0.1:{tcp}"
    ]
    assert took < 30.0, took  # not retried: the address is wrong, not down
    fixed = run_cli("topic", "list", "--server", f"txb://127.0.0.1:{tcp}")
    assert fixed.returncode == 0 and fixed.stderr == "no topics\n"


def test_the_tcp_port_answers_http_naming_the_http_port(broker: BrokerProcess) -> None:
    tcp, http_port = broker.url.removeprefix("txb://"), _port(broker.http)
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(f"http://{tcp}/healthz", timeout=10)
    assert caught.value.code == 400
    text = caught.value.read().decode()
    assert text == (
        "This is a txbroker TCP port: it speaks txbroker's binary protocol (txb://), not HTTP; "
        f"this broker's HTTP port (API, console) is {http_port}.\n"
    )
    # Written before the answer went out.
    assert (
        "an HTTP request (GET /healthz HTTP/1.1) from ('127.0.0.1', " in broker.log_path.read_text()
    )


def test_a_token_for_a_broker_without_tokens_is_warned_once(
    broker: BrokerProcess, tmp_path_factory: pytest.TempPathFactory
) -> None:
    out = run_cli("topic", "list", "--server", broker.url, "--auth-token", "s3cret")
    assert out.returncode == 0
    address = broker.url.removeprefix("txb://")
    assert out.stderr.splitlines() == [
        f"txbroker: warning: an auth token was given, but the broker at {address} checks none "
        "(it has no tokens): the token is ignored, and the broker serves anyone who can reach it",
        "no topics",
    ]
    # A broker that checks tokens: no warning.
    guarded = BrokerProcess(tmp_path_factory.mktemp("guarded") / "broker", "--auth-token", "s3cret")
    guarded.start()
    try:
        out = run_cli("topic", "list", "--server", guarded.url, "--auth-token", "s3cret")
        assert out.returncode == 0 and out.stderr == "no topics\n"
    finally:
        guarded.stop()


def test_tx_prepare_help_names_its_default_producer_group() -> None:
    out = run_cli("tx", "prepare", "--help")
    assert out.returncode == 0
    assert "(default: cli)" in " ".join(out.stdout.split())


def test_the_broker_and_token_come_from_the_variables_a_service_reads(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """The CLI and TxbService read the same names (txbroker_sdk.settings): a shell set up for
    one works for the other. The --server help names the same default."""
    guarded = BrokerProcess(tmp_path_factory.mktemp("env") / "broker", "--auth-token", "s3cret")
    guarded.start()
    try:
        out = run_cli("topic", "list", env={SERVER: guarded.url, AUTH_TOKEN: "s3cret"})
        assert (out.returncode, out.stderr) == (0, "no topics\n"), out.stderr
        out = run_cli("topic", "list", env={SERVER: guarded.url, AUTH_TOKEN: "wrong"})
        assert out.returncode != 0 and "UNAUTHENTICATED" in out.stderr, out.stderr
    finally:
        guarded.stop()
    out = run_cli("topic", "list", "--help")
    assert f"(TXB_SERVER; default {DEFAULT_SERVER})" in " ".join(out.stdout.split())

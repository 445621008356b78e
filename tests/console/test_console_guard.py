"""The console as a real server (a `replaysafe-pg console` subprocess on a free loopback
port) reached over HTTP: the access token, cross-site requests, escaping, and who may
settle what. The database is the test's own clone; roles are real LOGIN roles."""

from __future__ import annotations

import signal
from collections.abc import Callable

from helpers.console import HOSTILE, Served, state_of
from helpers.db import bind, dsn_as


def test_every_request_needs_the_token(seeded: str, console_for: Callable[[str], Served]) -> None:
    served = console_for(seeded)
    with served.client() as anonymous:
        for path in ("/", "/actions", "/threads", "/action?tenant=acme&key=charge-9"):
            assert anonymous.get(path).status_code == 401
        assert anonymous.get("/?token=wrong").status_code == 401
        assert anonymous.get("/", headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert anonymous.post("/action/resolve", data={"tenant": "acme", "key": HOSTILE,
                                                       "state": "succeeded", "note": "x"},
                              ).status_code == 401
    with served.client() as other:
        first = other.get(f"/actions?token={served.token}&state=unknown")
        # The token leaves the address at once; a cookie carries it from then on.
        assert first.status_code == 303 and first.headers["location"] == "/actions?state=unknown"
        assert "HttpOnly" in first.headers["set-cookie"]
        assert "samesite=strict" in first.headers["set-cookie"].lower()
        page = other.get("/")
        assert page.status_code == 200
        assert page.headers["content-security-policy"].startswith("default-src 'none'")
        assert served.token not in page.text
    assert state_of(seeded, HOSTILE)[0] == "unknown"


def test_a_hostile_key_is_shown_as_text(seeded: str, console_for: Callable[[str], Served]) -> None:
    served = console_for(seeded)
    with served.signed_in() as client:
        for page in (client.get("/"), client.get("/actions"),
                     client.get("/action", params={"tenant": "acme", "key": HOSTILE})):
            assert page.status_code == 200
            assert "<script>" not in page.text
            assert "refund-&lt;script&gt;alert(1)&lt;/script&gt;" in page.text


def test_a_loopback_console_answers_only_to_a_loopback_host(
        seeded: str, console_for: Callable[[str], Served]) -> None:
    served = console_for(seeded)
    with served.signed_in() as client:
        # A page on a name that resolves to 127.0.0.1 (DNS rebinding) sends its own Host.
        assert client.get("/", headers={"Host": "attacker.example:80"}).status_code == 400


def test_a_cross_site_post_is_refused(seeded: str, console_for: Callable[[str], Served]) -> None:
    served = console_for(seeded)
    with served.signed_in() as client:
        token = served.form_token(client, "acme", HOSTILE)
        form = {"form_token": token, "tenant": "acme", "key": HOSTILE, "state": "succeeded",
                "result": "{}", "note": "forged"}
        for headers in ({"Origin": "http://127.0.0.1:1"}, {"Origin": "null"},
                        {"Sec-Fetch-Site": "cross-site"}, {}):
            answer = client.post("/action/resolve", data=form, headers=headers)
            assert answer.status_code == 403, headers
        # From the console's own origin but without the form's token: refused too.
        answer = client.post("/action/resolve", data={**form, "form_token": "0" * 64},
                             headers={"Origin": served.base})
        assert answer.status_code == 400
    assert state_of(seeded, HOSTILE) == ("unknown", None)


def test_an_operators_resolve_reaches_the_audit_views_with_its_note(
        seeded: str, make_role: Callable[..., str], console_for: Callable[[str], Served]) -> None:
    operator = make_role("replaysafe_operator")
    bind(seeded, operator, "acme")
    served = console_for(dsn_as(seeded, operator))
    with served.signed_in() as client:
        page = client.get("/action", params={"tenant": "acme", "key": HOSTILE}).text
        assert 'id="resolve"' in page
        answer = client.post("/action/resolve", headers={"Origin": served.base}, data={
            "form_token": served.form_token(client, "acme", HOSTILE), "tenant": "acme",
            "key": HOSTILE, "state": "succeeded", "result": '{"refunded": 42}',
            "provider_reference": "re_1", "note": "refund re_1 seen at the provider"})
        assert answer.status_code == 303
        shown = client.get(answer.headers["location"]).text
        assert "resolved: unknown → succeeded" in shown
        assert "refund re_1 seen at the provider" in shown
        reopen = client.post("/action/reopen", headers={"Origin": served.base}, data={
            "form_token": served.form_token(client, "acme", "charge-9"), "tenant": "acme",
            "key": "charge-9", "note": "card replaced"})
        assert reopen.status_code == 303
    assert state_of(seeded, HOSTILE) == ("succeeded", "refund re_1 seen at the provider")
    assert state_of(seeded, "charge-9") == ("retryable", "card replaced")


def test_an_auditor_reads_but_cannot_resolve(
        seeded: str, make_role: Callable[..., str], console_for: Callable[[str], Served]) -> None:
    auditor = make_role("replaysafe_auditor")
    bind(seeded, auditor, "acme")
    served = console_for(dsn_as(seeded, auditor))
    with served.signed_in() as client:
        page = client.get("/action", params={"tenant": "acme", "key": HOSTILE}).text
        assert "read-only" in page and 'id="resolve"' not in page
        assert HOSTILE.replace("<", "&lt;").replace(">", "&gt;") in client.get("/").text
        # The form token of an operator's page is the same for every page: a hand-made
        # POST reaches the database, which refuses it.
        answer = client.post("/action/resolve", headers={"Origin": served.base}, data={
            "form_token": _form_token_of(served), "tenant": "acme", "key": HOSTILE,
            "state": "succeeded", "result": "{}", "note": "auditor tries"})
        assert answer.status_code == 403
        assert "Refused by the database" in answer.text
    assert state_of(seeded, HOSTILE) == ("unknown", None)


def _form_token_of(served: Served) -> str:
    from replaysafe_pg.cli.console.app import form_token

    return form_token(served.token)


def test_ctrl_c_exits_130_and_sigterm_0(seeded: str, console_for: Callable[[str], Served]) -> None:
    for sig, status in ((signal.SIGINT, 130), (signal.SIGTERM, 0)):
        served = console_for(seeded)
        served.proc.send_signal(sig)
        assert served.proc.wait(15) == status

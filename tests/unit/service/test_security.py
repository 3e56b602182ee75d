"""service/security.py and the door that asks it: the `feedback` scope, the hosts a request
may name (no DNS rebinding), the token file read again when it changes (HTTP and gRPC), and
the one line said at start when there are no tokens. Fast tier: fakes, no TensorFlow."""

from __future__ import annotations

import hashlib
import logging
import os

import numpy as np
import pytest
from support.fakes import MODEL_NAME, FakeBackend, app_client
from support.helpers import error_message, logged

from artifact.feedback import ANONYMOUS
from service.app import create_app
from service.security import (
    FEEDBACK,
    PREDICT,
    STATUS,
    Access,
    Scopes,
    TokenFile,
    TokenFileError,
    allowed_hosts,
    host_name,
    open_access_notice,
    read_tokens,
    scope_of,
    token_digest,
    token_name,
)
from service.settings import Settings

PREDICT_TOKEN = "predict-token-0123456789"
FEEDBACK_TOKEN = "feedback-token-0123456789"
STATUS_TOKEN = "status-token-0123456789"
NEW_TOKEN = "rotated-token-0123456789"
PREDICT_URL = f"/v1/models/{MODEL_NAME}:predict"
FEEDBACK_URL = f"/v1/models/{MODEL_NAME}/feedback"
ZEROS = np.zeros((1, 28, 28)).tolist()


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def tokens_file(tmp_path):
    path = tmp_path / "tokens"
    path.write_text(f"{PREDICT_TOKEN} predict\n{FEEDBACK_TOKEN} feedback\n{STATUS_TOKEN} status\n")
    return path


# --- the feedback scope ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "method, path, needed",
    [
        pytest.param("POST", FEEDBACK_URL, FEEDBACK, id="feedback"),
        pytest.param("POST", "/V1/MODELS/other/FEEDBACK", FEEDBACK, id="feedback-any-case"),
        pytest.param("POST", PREDICT_URL, PREDICT, id="predict"),
        pytest.param("POST", "/predict", PREDICT, id="friendly"),
        pytest.param("POST", f"/v2/models/{MODEL_NAME}/infer", PREDICT, id="v2"),
        pytest.param("GET", f"/v1/models/{MODEL_NAME}", STATUS, id="status"),
        pytest.param("GET", "/metrics", STATUS, id="metrics"),
        pytest.param("GET", "/page/models", STATUS, id="page-views"),
        pytest.param("GET", "/healthz", None, id="probe"),
        pytest.param("GET", "/v2/health/ready", None, id="v2-probe"),
        pytest.param("GET", "/", None, id="page"),
        pytest.param("GET", "/static/app.js", None, id="page-files"),
        pytest.param("GET", "/docs", None, id="docs"),
        pytest.param("GET", "/openapi.json", None, id="openapi"),
    ],
)
def test_the_scope_each_route_needs(method, path, needed):
    table = create_app(Settings(), FakeBackend()).ingress.table
    assert table.match(method, path).route.scope == needed


@pytest.mark.parametrize("method, needed", [("GET", STATUS), ("HEAD", STATUS), ("POST", PREDICT),
                                            ("DELETE", PREDICT)])  # fmt: skip
def test_a_request_no_route_answers_needs_a_token_before_it_is_told_so(method, needed):
    assert scope_of(method) == needed


def test_a_predict_token_cannot_post_feedback_and_a_feedback_token_can(tokens_file, tmp_path):
    body = {"instances": ZEROS, "labels": [1]}
    with app_client(
        FakeBackend(), auth_tokens_file=str(tokens_file), feedback_dir=str(tmp_path / "fb")
    ) as client:
        refused = client.post(FEEDBACK_URL, json=body, headers=bearer(PREDICT_TOKEN))
        assert "does not have the 'feedback' scope" in error_message(refused, 403)
        assert 'scope="feedback"' in refused.headers["www-authenticate"]
        assert client.post(FEEDBACK_URL, json=body, headers=bearer(FEEDBACK_TOKEN)).json() == {
            "model_name": MODEL_NAME,
            "stored": 1,
            "labels": ["Trouser"],
            "model_version": None,
        }
        # And the other way: a feedback token predicts nothing.
        predict = {"instances": ZEROS}
        assert (
            client.post(PREDICT_URL, json=predict, headers=bearer(FEEDBACK_TOKEN)).status_code
            == 403
        )
        assert (
            client.post(PREDICT_URL, json=predict, headers=bearer(PREDICT_TOKEN)).status_code == 200
        )


def test_a_tokens_file_may_name_the_feedback_scope(tmp_path):
    path = tmp_path / "tokens"
    path.write_text(f"{PREDICT_TOKEN} predict,feedback,status\n")
    assert read_tokens(path) == {token_digest(PREDICT_TOKEN): {PREDICT, FEEDBACK, STATUS}}


def test_only_digests_of_the_tokens_are_kept(tokens_file):
    """The process holds the sha256 of each token, never the token: a model that reads the
    server's memory or files finds nothing to replay."""
    tokens = TokenFile(tokens_file)
    for token in (PREDICT_TOKEN, FEEDBACK_TOKEN, STATUS_TOKEN):
        assert token.encode() not in tokens
        assert tokens[token_digest(token)] >= set()
    assert all(len(key) == 32 for key in tokens)
    assert token_digest(PREDICT_TOKEN) == hashlib.sha256(PREDICT_TOKEN.encode()).digest()


def test_a_tokens_file_of_digests_takes_the_raw_tokens(tmp_path):
    """`sha256:<hex>` entries (what `make tokens` writes): the server's file holds no token a
    reader of it could send, and raw entries still work beside them."""
    path = tmp_path / "tokens"
    hexdigest = hashlib.sha256(PREDICT_TOKEN.encode()).hexdigest()
    path.write_text(f"sha256:{hexdigest} predict,status\n{STATUS_TOKEN} status watcher\n")
    body = {"instances": ZEROS}
    with app_client(FakeBackend(), auth_tokens_file=str(path)) as client:
        assert client.post(PREDICT_URL, json=body, headers=bearer(PREDICT_TOKEN)).status_code == 200
        # The entry itself is no token.
        by_digest = bearer(f"sha256:{hexdigest}")
        assert client.post(PREDICT_URL, json=body, headers=by_digest).status_code == 401
        status = client.get(f"/v1/models/{MODEL_NAME}", headers=bearer(STATUS_TOKEN))
        assert status.status_code == 200
    # A digest line and a raw line of one token name it alike.
    assert read_tokens(path)[token_digest(PREDICT_TOKEN)].name == token_name(PREDICT_TOKEN)


@pytest.mark.parametrize(
    "entry",
    [
        pytest.param("sha256:abc", id="short"),
        pytest.param("sha256:" + "g" * 64, id="not-hex"),
        pytest.param("sha512:" + "0" * 128, id="another-hash"),
    ],
)
def test_a_bad_digest_names_its_line(tmp_path, entry):
    path = tmp_path / "tokens"
    path.write_text(f"{STATUS_TOKEN} status\n{entry} predict\n")
    with pytest.raises(TokenFileError, match=f"{path}:2: "):
        read_tokens(path)


def test_each_token_has_a_name_that_is_not_the_token(tmp_path):
    path = tmp_path / "tokens"
    path.write_text(
        f"{PREDICT_TOKEN} predict alice\n{NEW_TOKEN} predict alice\n{FEEDBACK_TOKEN} feedback\n"
    )
    tokens = read_tokens(path)
    names = {token: scopes.name for token, scopes in tokens.items()}
    # Two tokens of one name (a rotation) are one sender; a line without a name gets one
    # from the token's hash, which tells tokens apart without showing them.
    assert names[token_digest(PREDICT_TOKEN)] == names[token_digest(NEW_TOKEN)] == "alice"
    unnamed = names[token_digest(FEEDBACK_TOKEN)]
    assert unnamed == token_name(FEEDBACK_TOKEN) and unnamed.startswith("token-")
    assert len(unnamed) == len("token-") + 8 and FEEDBACK_TOKEN[:8] not in unnamed
    assert unnamed != token_name(PREDICT_TOKEN)


@pytest.mark.parametrize(
    "line, message",
    [
        pytest.param(f"{PREDICT_TOKEN} predict a b", "expected `<token> <scope>", id="four-fields"),
        pytest.param(f"{PREDICT_TOKEN} predict -x", "a token's name is 1-64", id="leading-dash"),
        pytest.param(f"{PREDICT_TOKEN} predict {'n' * 65}", "a token's name", id="too-long"),
    ],
)
def test_a_bad_token_name_names_its_line(tmp_path, line, message):
    path = tmp_path / "tokens"
    path.write_text(f"# tokens\n{line}\n")
    with pytest.raises(TokenFileError, match=f"{path}:2: {message}"):
        read_tokens(path)


def test_the_decision_names_the_sender_by_its_token_and_never_by_the_token():
    tokens = {token_digest(PREDICT_TOKEN): Scopes({PREDICT, FEEDBACK}, "alice")}
    access = Access(tokens, [])

    def request(authorization: str | None, path: str = FEEDBACK_URL) -> dict:
        headers = [(b"host", b"127.0.0.1")]
        if authorization is not None:
            headers.append((b"authorization", authorization.encode()))
        return {"method": "POST", "path": path, "headers": headers}

    assert access.check(request(f"Bearer {PREDICT_TOKEN}"), FEEDBACK).sender == "alice"
    refused = access.check(request(f"Bearer {FEEDBACK_TOKEN}"), FEEDBACK)
    assert refused.refusal.status_code == 401 and refused.sender == ANONYMOUS
    assert Access(None, []).check(request(None), FEEDBACK).sender == ANONYMOUS  # no tokens


# --- hosts and origins ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "header, name",
    [
        pytest.param(b"localhost:8000", "localhost", id="port"),
        pytest.param(b"API.Example.com", "api.example.com", id="case"),
        pytest.param(b"[::1]:8000", "::1", id="ipv6"),
        pytest.param(b"example.com.", "example.com", id="trailing-dot"),
    ],
)
def test_host_names(header, name):
    assert host_name(header) == name


def scope_of_request(host: str, origin: str | None = None, path: str = "/predict") -> dict:
    headers = [(b"host", host.encode())]
    if origin is not None:
        headers.append((b"origin", origin.encode()))
    return {"method": "POST", "path": path, "headers": headers}


def test_a_rebound_name_is_not_same_origin():
    """DNS rebinding: evil.example made to resolve to 127.0.0.1; the page's requests carry
    Origin and Host `evil.example`, which today's same-origin rule took for the service's."""
    access = Access(None, [], allowed_hosts("127.0.0.1", []))
    rebound = access.check(
        scope_of_request("evil.example:8000", "http://evil.example:8000"), PREDICT
    )
    assert rebound.refusal is not None and rebound.refusal.status_code == 403
    for host in ("127.0.0.1:8000", "localhost:8000", "[::1]:8000"):
        own = access.check(scope_of_request(host, f"http://{host}"), PREDICT)
        assert own.refusal is None, host


def test_same_origin_for_the_names_the_service_answers_for():
    access = Access(None, [], allowed_hosts("0.0.0.0", ["api.example.com", ".corp.example"]))
    for host in ("api.example.com", "a.corp.example", "corp.example", "localhost:8000"):
        assert access.check(scope_of_request(host, f"https://{host}"), PREDICT).refusal is None, (
            host
        )
    # A wildcard HOST is no name: it does not make every Host the service's own.
    for host in ("0.0.0.0:8000", "evil.example", "corp.example.evil"):
        assert (
            access.check(scope_of_request(host, f"http://{host}"), PREDICT).refusal is not None
        ), host


def test_with_allowed_hosts_another_host_is_refused_but_probes_answer():
    backend = FakeBackend()
    with app_client(backend, host="0.0.0.0", allowed_hosts="api.example.com") as client:
        evil = client.post(PREDICT_URL, json={"instances": ZEROS}, headers={"Host": "evil.example"})
        assert error_message(evil, 400) == (
            "the host 'evil.example' is not one this service answers for (ALLOWED_HOSTS)"
        )
        assert backend.calls == []
        good = client.post(
            PREDICT_URL, json={"instances": ZEROS}, headers={"Host": "api.example.com"}
        )
        assert good.status_code == 200
        # Kubelets probe by the pod's address.
        assert client.get("/readyz", headers={"Host": "10.1.2.3:8000"}).status_code == 200


def test_without_allowed_hosts_any_host_is_served():
    with app_client(FakeBackend(), host="0.0.0.0") as client:
        response = client.post(
            PREDICT_URL, json={"instances": ZEROS}, headers={"Host": "x.example"}
        )
        assert response.status_code == 200


# --- the token file, read again -------------------------------------------------------------


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def rewrite(path, text: str) -> None:
    """A new file at the path (as a Secret's update swaps it), with a new modification time."""
    new = path.with_suffix(".new")
    new.write_text(text)
    os.replace(new, path)


def test_the_token_file_is_read_again_when_it_changes_at_most_every_check(tokens_file):
    clock = Clock()
    tokens = TokenFile(tokens_file, check_seconds=2.0, clock=clock)
    assert set(tokens) == {token_digest(t) for t in (PREDICT_TOKEN, FEEDBACK_TOKEN, STATUS_TOKEN)}
    rewrite(tokens_file, f"{NEW_TOKEN} predict\n")
    clock.now += 1.0
    assert token_digest(PREDICT_TOKEN) in tokens, "looked at again before check_seconds"
    clock.now += 1.5
    with logged("service.security") as records:
        assert dict(tokens.items()) == {token_digest(NEW_TOKEN): {PREDICT}}
    assert any("AUTH_TOKENS_FILE read again: 1 tokens" in r.getMessage() for r in records)


@pytest.mark.parametrize(
    "change, left, warning",
    [
        pytest.param(lambda path: rewrite(path, ""), set(), "holds no token", id="emptied"),
        pytest.param(lambda path: path.write_text(""), set(), "holds no token", id="truncated"),
        pytest.param(lambda path: rewrite(path, "# all revoked\n"), set(), "holds no token",
                     id="only-comments"),
        pytest.param(os.remove, set(), "cannot read it", id="deleted"),
        pytest.param(lambda path: rewrite(path, f"{STATUS_TOKEN} status\nshort predict\n"),
                     {STATUS_TOKEN}, ":2: a token must have 16 characters or more",
                     id="a-bad-line"),
        pytest.param(lambda path: rewrite(path, f"{STATUS_TOKEN} status\n{FEEDBACK_TOKEN} owner\n"),
                     {STATUS_TOKEN}, ":2: unknown scope(s) owner", id="a-bad-scope"),
        pytest.param(lambda path: path.write_bytes(f"{STATUS_TOKEN} status\n\xff\xfe predict\n".encode("latin-1")),
                     {STATUS_TOKEN}, ":2: not UTF-8", id="a-line-not-utf-8"),
    ],
)  # fmt: skip
def test_revocation_fails_closed(tokens_file, change, left, warning):
    """An emptied, deleted or partly malformed tokens file revokes what it no longer holds:
    an empty or missing file every token, a bad line that line's (the review kept every old
    token in force)."""
    clock = Clock()
    tokens = TokenFile(tokens_file, check_seconds=0, clock=clock)
    change(tokens_file)
    with logged("service.security") as records:
        for _ in range(3):
            clock.now += 10
            assert set(tokens) == {token_digest(token) for token in left}
    (record,) = [r for r in records if r.levelno == logging.WARNING]  # said once
    assert warning in record.getMessage()
    rewrite(tokens_file, f"{NEW_TOKEN} status\n")
    clock.now += 10
    assert dict(tokens.items()) == {token_digest(NEW_TOKEN): {STATUS}}


def test_http_refuses_a_revoked_token(tokens_file):
    with app_client(
        FakeBackend(), auth_tokens_file=str(tokens_file), auth_tokens_check_seconds=0
    ) as client:
        status_url = f"/v1/models/{MODEL_NAME}"
        assert client.get(status_url, headers=bearer(STATUS_TOKEN)).status_code == 200
        tokens_file.write_text("")
        assert client.get(status_url, headers=bearer(STATUS_TOKEN)).status_code == 401
        tokens_file.write_text(f"{STATUS_TOKEN} status\n")
        assert client.get(status_url, headers=bearer(STATUS_TOKEN)).status_code == 200
        os.remove(tokens_file)
        assert client.get(status_url, headers=bearer(STATUS_TOKEN)).status_code == 401


def test_http_sees_a_rotated_token(tokens_file):
    """AUTH_TOKENS_CHECK_SECONDS=0: every request looks (gRPC shares the same TokenFile:
    tests/live/service/test_security_grpc.py)."""
    with app_client(
        FakeBackend(), auth_tokens_file=str(tokens_file), auth_tokens_check_seconds=0
    ) as client:
        status_url = f"/v1/models/{MODEL_NAME}"
        assert client.get(status_url, headers=bearer(NEW_TOKEN)).status_code == 401
        rewrite(tokens_file, f"{NEW_TOKEN} status\n")
        assert client.get(status_url, headers=bearer(NEW_TOKEN)).status_code == 200
        assert client.get(status_url, headers=bearer(STATUS_TOKEN)).status_code == 401


# --- said at start --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "host, level",
    [
        pytest.param("127.0.0.1", logging.INFO, id="loopback"),
        pytest.param("localhost", logging.INFO, id="localhost"),
        pytest.param("::1", logging.INFO, id="ipv6-loopback"),
        pytest.param("0.0.0.0", logging.WARNING, id="every-interface"),
        pytest.param("10.0.0.5", logging.WARNING, id="an-address"),
    ],
)
def test_no_tokens_is_said_at_start_a_warning_off_loopback(host, level):
    found_level, message = open_access_notice(host, None)
    assert found_level == level
    assert message.startswith("No AUTH_TOKENS_FILE") and f"HOST={host}" in message
    assert open_access_notice(host, "/run/secrets/api-tokens") is None

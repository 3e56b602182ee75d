"""docker-compose.yml is secure as shipped, checked with Debian's docker-compose (`config`,
as tests/test_containers.py does; no engine runs here):

- both APIs read AUTH_TOKENS_FILE from a compose secret, a file that is git-ignored;
- every published port is bound to 127.0.0.1;
- every service has a read-only root filesystem, no capabilities, no privilege escalation,
  a memory limit and a tmpfs /tmp (with the GPU override too);
- feedback is off unless docker-compose.feedback.yml turns it on;
- the service, run with the environment compose gives the api service (AUTH_TOKENS_FILE, HOST
  and, with feedback on, FEEDBACK_DIR, paths mapped into a tmp dir; the fake backend),
  refuses an anonymous prediction and an anonymous feedback post, and a predict token's
  feedback post.
"""

from __future__ import annotations

import subprocess

import pytest
from support.compose import env, port_bindings
from support.fakes import MODEL_NAME, FakeBackend, app_client
from support.helpers import REPO_ROOT

from service.security import read_tokens, token_digest

APIS = ("api", "api-tfserving")
SECRETS_DIR = "/run/secrets/"


def secret_file(config: dict, service: dict, path: str) -> str:
    """The host file of the compose secret mounted at `path` in the service."""
    assert path.startswith(SECRETS_DIR), path
    mounted = {s.get("target", s["source"]): s["source"] for s in service.get("secrets", [])}
    source = mounted[path.removeprefix(SECRETS_DIR)]
    return config["secrets"][source]["file"]


@pytest.mark.parametrize("name", APIS)
def test_the_apis_read_their_tokens_from_a_git_ignored_compose_secret(config, name):
    service = config["services"][name]
    file = secret_file(config, service, env(service)["AUTH_TOKENS_FILE"])
    ignored = subprocess.run(["git", "check-ignore", "-q", file], cwd=REPO_ROOT, timeout=60)
    assert ignored.returncode == 0, f"{file} is not git-ignored"


def test_every_port_is_published_on_loopback_only(config):
    bindings = {name: port_bindings(s) for name, s in config["services"].items()}
    assert {name: {address for address, _, _ in b} for name, b in bindings.items() if b} == {
        "api": {"127.0.0.1"},
        "api-tfserving": {"127.0.0.1"},
        "tfserving": {"127.0.0.1"},
    }


@pytest.mark.parametrize("which", ["config", "gpu_config", "feedback_config"])
def test_every_service_is_hardened(which, request):
    problems = []
    for name, service in request.getfixturevalue(which)["services"].items():
        checks = {
            "read_only": service.get("read_only") is True,
            "cap_drop ALL": service.get("cap_drop") == ["ALL"] and not service.get("cap_add"),
            "no-new-privileges": "no-new-privileges:true" in service.get("security_opt", []),
            "mem_limit": bool(service.get("mem_limit")),
            "tmpfs /tmp": any(t.split(":")[0] == "/tmp" for t in service.get("tmpfs", [])),
            "not privileged": not service.get("privileged"),
        }
        problems += [f"{name}: {check}" for check, ok in checks.items() if not ok]
    assert problems == []


def test_feedback_is_off_unless_the_feedback_override_turns_it_on(config, feedback_config):
    for name in APIS:
        assert "FEEDBACK_DIR" not in env(config["services"][name]), name
        assert not any("/feedback" in v for v in config["services"][name]["volumes"]), name
        assert env(feedback_config["services"][name])["FEEDBACK_DIR"] == "/feedback", name


@pytest.mark.parametrize("which", ["config", "feedback_config"])
def test_the_api_with_composes_environment_refuses_anonymous_calls(
    which, request, tmp_path, make_tokens
):
    service = request.getfixturevalue(which)["services"]["api"]
    variables = env(service)
    host_file = tmp_path / variables["AUTH_TOKENS_FILE"].lstrip("/")
    issued = make_tokens.write_tokens(host_file)
    settings = {"host": variables["HOST"], "auth_tokens_file": str(host_file)}
    if "FEEDBACK_DIR" in variables:
        settings["feedback_dir"] = str(tmp_path / variables["FEEDBACK_DIR"].lstrip("/"))
    # The tokens as handed out; the mounted file holds their digests.
    issued_lines = [line.split() for line in issued.read_text().splitlines() if line[:1] != "#"]
    (client_token,) = [token for token, scopes, _ in issued_lines if "predict" in scopes]
    (feedback_token,) = [token for token, scopes, _ in issued_lines if scopes == "feedback"]
    assert set(read_tokens(host_file)) == {token_digest(t) for t, _, _ in issued_lines}
    body = {"instances": [[[0.0] * 28] * 28]}
    predict_url = f"/v1/models/{MODEL_NAME}:predict"
    feedback_url = f"/v1/models/{MODEL_NAME}/feedback"
    with app_client(FakeBackend(), **settings) as client:
        assert client.post(predict_url, json=body).status_code == 401
        assert client.post(feedback_url, json={**body, "labels": [1]}).status_code == 401
        for path in ("/metrics", f"/v1/models/{MODEL_NAME}", f"/page/models/{MODEL_NAME}/versions"):
            assert client.get(path).status_code == 401, path
        as_client = {"Authorization": f"Bearer {client_token}"}
        assert client.post(predict_url, json=body, headers=as_client).status_code == 200
        refused = client.post(feedback_url, json={**body, "labels": [1]}, headers=as_client)
        assert refused.status_code == 403
        as_teacher = {"Authorization": f"Bearer {feedback_token}"}
        stored = client.post(feedback_url, json={**body, "labels": [1]}, headers=as_teacher)
        if "feedback_dir" in settings:
            assert stored.status_code == 200 and stored.json()["stored"] == 1
        else:
            assert "feedback is off" in stored.json()["error"] and stored.status_code == 403

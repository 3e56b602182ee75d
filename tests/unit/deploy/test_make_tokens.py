"""deploy/make_tokens.py (`make tokens`): the service's tokens file, which holds only the
tokens' digests, the tokens themselves in a copy beside it, with a client token, Prometheus's
scrape token and a feedback token, and the scrape token alone for its Secret, private to their owner, never overwritten, and git-ignored."""

from __future__ import annotations

import stat
import subprocess
import sys

import pytest
from support.fakes import MODEL_NAME, FakeBackend, app_client
from support.helpers import REPO_ROOT

from artifact.feedback import SENDER_PATTERN
from service.security import FEEDBACK, PREDICT, STATUS, read_tokens, token_digest


def issued_tokens(path) -> dict[str, tuple[str, str]]:
    """name -> (token, scopes) of a `.issued` file."""
    lines = [line.split() for line in path.read_text().splitlines() if not line.startswith("#")]
    return {name: (token, scopes) for token, scopes, name in lines}


def test_the_service_file_holds_digests_and_the_copy_the_tokens(make_tokens, tmp_path):
    path = tmp_path / "secrets" / "api-tokens"
    issued = make_tokens.write_tokens(path)
    assert issued == tmp_path / "secrets" / "api-tokens.issued"
    tokens = read_tokens(path)
    assert sorted(map(sorted, tokens.values())) == [[FEEDBACK], [PREDICT, STATUS], [STATUS]]
    # Named: the feedback store records the name with each image, never the token.
    assert sorted(s.name for s in tokens.values()) == ["clients", "feedback-1", "prometheus"]
    handed_out = issued_tokens(issued)
    assert sorted(handed_out) == ["clients", "feedback-1", "prometheus"]
    # Prometheus's token reads the metrics and nothing that predicts.
    assert handed_out["prometheus"][1] == STATUS
    scrape = tmp_path / "secrets" / "api-tokens.prometheus"
    assert scrape.read_text() == handed_out["prometheus"][0] + "\n"
    for name, (token, _) in handed_out.items():
        assert len(token) >= 40
        assert token not in path.read_text(), "the service's file holds a token"
        assert tokens[token_digest(token)].name == name
    for written in (path, issued, scrape):
        assert stat.S_IMODE(written.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    # The service takes the tokens handed out, against the file of digests.
    with app_client(FakeBackend(), auth_tokens_file=str(path)) as client:
        headers = {"Authorization": f"Bearer {handed_out['clients'][0]}"}
        assert client.get(f"/v1/models/{MODEL_NAME}", headers=headers).status_code == 200
        scraper = {"Authorization": f"Bearer {scrape.read_text().strip()}"}
        assert client.get("/metrics", headers=scraper).status_code == 200
        assert client.get("/metrics").status_code == 401
        body = {"instances": [[[0.0] * 28] * 28]}
        refused = client.post(f"/v1/models/{MODEL_NAME}:predict", json=body, headers=scraper)
        assert refused.status_code == 403
    # Random each time.
    other = tmp_path / "other"
    make_tokens.write_tokens(other)
    assert not set(read_tokens(other)) & set(tokens)


def test_each_sender_gets_a_token_and_a_name_of_its_own(make_tokens, tmp_path):
    """The review: one shared `feedback` name made the per-sender bounds bound little."""
    path = tmp_path / "api-tokens"
    make_tokens.write_tokens(path, ["lab-a", "lab-b"])
    tokens = read_tokens(path)
    senders = sorted(s.name for s in tokens.values() if s == {FEEDBACK})
    assert senders == ["lab-a", "lab-b"]
    # One more, later, to both files; a name taken, or one the service would refuse, is not.
    token = make_tokens.add_sender(path, "lab-c")
    assert read_tokens(path)[token_digest(token)].name == "lab-c"
    assert issued_tokens(make_tokens.issued_path(path))["lab-c"] == (token, FEEDBACK)
    for name, error in (("lab-a", "named 'lab-a' already"), ("-x", "a sender's name")):
        with pytest.raises(ValueError, match=error):
            make_tokens.add_sender(path, name)
    for senders in (["lab-a", "lab-a"], ["prometheus"], ["clients"]):
        with pytest.raises(ValueError, match="a name of its own"):
            make_tokens.write_tokens(tmp_path / "twice", senders)
        assert not (tmp_path / "twice").exists()


def test_the_names_are_the_ones_the_service_takes(make_tokens):
    assert make_tokens.NAME_PATTERN.pattern == SENDER_PATTERN.pattern


def test_make_tokens_takes_the_senders(tmp_path):
    path = tmp_path / "api-tokens"
    subprocess.run(
        ["make", "-s", "-C", str(REPO_ROOT), "tokens", f"TOKENS_FILE={path}", "SENDERS=a b"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert sorted(s.name for s in read_tokens(path).values()) == ["a", "b", "clients", "prometheus"]


def test_an_existing_file_is_left_alone(tmp_path):
    for existing in ("api-tokens", "api-tokens.issued", "api-tokens.prometheus"):
        folder = tmp_path / existing
        folder.mkdir()
        (folder / existing).write_text("kept-token-0123456789 status\n")
        result = subprocess.run(
            [
                sys.executable,
                str(REPO_ROOT / "deploy" / "make_tokens.py"),
                str(folder / "api-tokens"),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 1 and "the files left as they are" in result.stderr
        assert [p.name for p in folder.iterdir()] == [existing]
        assert (folder / existing).read_text() == "kept-token-0123456789 status\n"


def test_the_default_file_is_git_ignored_and_the_makefile_writes_it(make_tokens):
    ignored = subprocess.run(
        ["git", "check-ignore", "-q", make_tokens.DEFAULT_FILE], cwd=REPO_ROOT, timeout=60
    )
    assert ignored.returncode == 0, f"{make_tokens.DEFAULT_FILE} is not git-ignored"
    makefile = (REPO_ROOT / "Makefile").read_text()
    assert f"TOKENS_FILE ?= {make_tokens.DEFAULT_FILE}" in makefile
    assert "deploy/make_tokens.py $(TOKENS_FILE)" in makefile

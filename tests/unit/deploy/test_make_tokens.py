"""deploy/make_tokens.py (`make tokens`): a tokens file the service reads, with a client
token and a feedback token, private to its owner, never overwritten, and git-ignored."""

from __future__ import annotations

import stat
import subprocess
import sys

from support.helpers import REPO_ROOT

from service.security import FEEDBACK, PREDICT, STATUS, read_tokens


def test_the_file_holds_a_client_and_a_feedback_token_for_its_owner_only(make_tokens, tmp_path):
    path = tmp_path / "secrets" / "api-tokens"
    make_tokens.write_tokens(path)
    tokens = read_tokens(path)
    assert sorted(tokens.values(), key=len) == [{FEEDBACK}, {PREDICT, STATUS}]
    # Named: the feedback store records the name with each image, never the token.
    assert sorted(scopes.name for scopes in tokens.values()) == ["clients", "feedback"]
    assert all(len(token) >= 40 for token in tokens)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    # Random each time.
    other = tmp_path / "other"
    make_tokens.write_tokens(other)
    assert not set(read_tokens(other)) & set(tokens)


def test_an_existing_file_is_left_alone(tmp_path):
    path = tmp_path / "api-tokens"
    path.write_text("kept-token-0123456789 status\n")
    result = subprocess.run(
        [sys.executable, str(REPO_ROOT / "deploy" / "make_tokens.py"), str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1 and "exists: left as it is" in result.stderr
    assert path.read_text() == "kept-token-0123456789 status\n"


def test_the_default_file_is_git_ignored_and_the_makefile_writes_it(make_tokens):
    ignored = subprocess.run(
        ["git", "check-ignore", "-q", make_tokens.DEFAULT_FILE], cwd=REPO_ROOT, timeout=60
    )
    assert ignored.returncode == 0, f"{make_tokens.DEFAULT_FILE} is not git-ignored"
    makefile = (REPO_ROOT / "Makefile").read_text()
    assert f"TOKENS_FILE ?= {make_tokens.DEFAULT_FILE}" in makefile
    assert "deploy/make_tokens.py $(TOKENS_FILE)" in makefile

"""Write a new AUTH_TOKENS_FILE: random bearer tokens, one per line, for the shipped deployments.

    python3 deploy/make_tokens.py [FILE]        # `make tokens`; FILE: secrets/api-tokens

The file gets two tokens, each `<token> <scope>[,<scope>] <name>` (service/security.py reads
them): one for clients (`predict,status`, named `clients`: predictions, model status,
metrics, the page's views) and one for whoever may teach the model (`feedback`, named
`feedback`: POST /v1/models/{name}/feedback; the feedback store records that name with each
image). Give each sender of feedback a token and a name of its own: the rate and the share of
the store are per name.
It is made readable by its owner only (0600) and never overwritten: an existing file is
left alone (exit 1). docker-compose.yml mounts it as the compose secret `api-tokens`;
for Kubernetes, make the Secret from it (docs/kubernetes.md):

    kubectl -n estimator-serving create secret generic api-tokens --from-file=tokens=FILE

Standard library only: it runs with any python3, outside the project's virtualenv.
"""

from __future__ import annotations

import os
import secrets
import sys
from pathlib import Path

DEFAULT_FILE = "secrets/api-tokens"
# 32 random bytes: 43 URL-safe characters (the service wants 16 or more).
TOKEN_BYTES = 32
# (scopes, name) of each token.
SCOPES = (("predict,status", "clients"), ("feedback", "feedback"))


def tokens_text() -> str:
    """A tokens file's text: a fresh random token for each line of SCOPES."""
    lines = ["# <token> <scope>[,<scope>] <name>: made by deploy/make_tokens.py"]
    lines += [f"{secrets.token_urlsafe(TOKEN_BYTES)} {scopes} {name}" for scopes, name in SCOPES]
    return "\n".join(lines) + "\n"


def write_tokens(path: Path) -> None:
    """Create `path` (mode 0600, its folder 0700 when made here) with new tokens.

    Raises:
        FileExistsError: the file exists; it is left as it was.
    """
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(tokens_text())


def main(argv: list[str]) -> int:
    path = Path(argv[0] if argv else DEFAULT_FILE)
    try:
        write_tokens(path)
    except FileExistsError:
        print(f"{path} exists: left as it is (remove it first for new tokens)", file=sys.stderr)
        return 1
    print(f"Wrote {path} (mode 0600). Kubernetes:")
    print(
        f"  kubectl -n estimator-serving create secret generic api-tokens --from-file=tokens={path}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

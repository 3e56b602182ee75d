"""Make bearer tokens for the shipped deployments: the service's AUTH_TOKENS_FILE, which holds
only their digests, and the tokens themselves for whoever hands them out.

    python3 deploy/make_tokens.py [FILE]        # `make tokens`; FILE: secrets/api-tokens

Two files, each readable by its owner only (0600) and never overwritten (if either exists,
both are left alone, exit 1):

- FILE, the service's: one line per token, `sha256:<hex digest> <scope>[,<scope>] <name>`
  (service/security.py reads it; it compares a request's token by its sha256). Whoever reads
  it, a model the server runs included, learns no token. docker-compose.yml mounts it as the
  compose secret `api-tokens`; for Kubernetes, make the Secret from it (docs/kubernetes.md):

      kubectl -n estimator-serving create secret generic api-tokens --from-file=tokens=FILE

- FILE.issued, the operator's: the same lines with the tokens themselves,
  `<token> <scope>[,<scope>] <name>`, to hand each to its holder. Never mount it.

The tokens: one for clients (`predict,status`, named `clients`: predictions, model status,
metrics, the page's views) and one for whoever may teach the model (`feedback`, named
`feedback`: POST /v1/models/{name}/feedback; the feedback store records that name with each
image). 43 random URL-safe characters each.

Standard library only: it runs with any python3, outside the project's virtualenv.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import sys
from pathlib import Path

DEFAULT_FILE = "secrets/api-tokens"
# The operator's copy, with the tokens themselves: FILE + this.
ISSUED_SUFFIX = ".issued"
# 32 random bytes: 43 URL-safe characters (the service wants 16 or more).
TOKEN_BYTES = 32
# (scopes, name) of each token.
SCOPES = (("predict,status", "clients"), ("feedback", "feedback"))
HEADER = "# <{}> <scope>[,<scope>] <name>: made by deploy/make_tokens.py"


def issued_path(path: Path) -> Path:
    """Where the tokens themselves go, beside the service's file."""
    return path.with_name(path.name + ISSUED_SUFFIX)


def new_tokens() -> list[tuple[str, str, str]]:
    """(token, scopes, name) for each line of SCOPES, every token fresh and random."""
    return [(secrets.token_urlsafe(TOKEN_BYTES), scopes, name) for scopes, name in SCOPES]


def service_text(tokens: list[tuple[str, str, str]]) -> str:
    """The service's AUTH_TOKENS_FILE: the tokens' sha256 digests, never the tokens."""
    lines = [HEADER.format("sha256 digest of the token") + "; the tokens: " + "*" + ISSUED_SUFFIX]
    lines += [
        f"sha256:{hashlib.sha256(token.encode()).hexdigest()} {scopes} {name}"
        for token, scopes, name in tokens
    ]
    return "\n".join(lines) + "\n"


def issued_text(tokens: list[tuple[str, str, str]]) -> str:
    """The operator's copy: the tokens themselves, to hand out (never mounted)."""
    lines = [HEADER.format("token") + "; hand each to its holder, never mount this file"]
    lines += [f"{token} {scopes} {name}" for token, scopes, name in tokens]
    return "\n".join(lines) + "\n"


def write_tokens(path: Path) -> Path:
    """Create `path` (digests) and its `.issued` copy (the tokens), mode 0600, their folder
    0700 when made here; the copy's path.

    Raises:
        FileExistsError: either exists; both are left as they were.
    """
    issued = issued_path(path)
    for existing in (path, issued):
        if existing.exists():
            raise FileExistsError(existing)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tokens = new_tokens()
    # The tokens first: a file of digests whose tokens were lost would be of no use.
    for target, text in ((issued, issued_text(tokens)), (path, service_text(tokens))):
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
    return issued


def main(argv: list[str]) -> int:
    path = Path(argv[0] if argv else DEFAULT_FILE)
    try:
        issued = write_tokens(path)
    except FileExistsError as err:
        print(f"{err} exists: both files left as they are (remove them for new tokens)",
              file=sys.stderr)  # fmt: skip
        return 1
    print(f"Wrote {path} (the service's: digests only) and {issued} (the tokens to hand out),")
    print("mode 0600. Kubernetes:")
    print(
        f"  kubectl -n estimator-serving create secret generic api-tokens --from-file=tokens={path}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

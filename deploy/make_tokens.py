"""Make bearer tokens for the shipped deployments: the service's AUTH_TOKENS_FILE, which holds
only their digests, and the tokens themselves for whoever hands them out.

    python3 deploy/make_tokens.py [FILE] [--sender NAME]...   # `make tokens`
    python3 deploy/make_tokens.py [FILE] --add NAME           # one more sender, both files

FILE: secrets/api-tokens by default.

Three files, each readable by its owner only (0600) and never overwritten (if any exists,
all are left alone, exit 1):

- FILE, the service's: one line per token, `sha256:<hex digest> <scope>[,<scope>] <name>`
  (service/security.py reads it; it compares a request's token by its sha256). Whoever reads
  it, a model the server runs included, learns no token. docker-compose.yml mounts it as the
  compose secret `api-tokens`; for Kubernetes, make the Secret from it (docs/kubernetes.md):

      kubectl -n estimator-serving create secret generic api-tokens --from-file=tokens=FILE

- FILE.issued, the operator's: the same lines with the tokens themselves,
  `<token> <scope>[,<scope>] <name>`, to hand each to its holder. Never mount it.

- FILE.prometheus, the scrape token alone (`status` scope, named `prometheus`), for the Secret
  the ServiceMonitor and the annotation scrape job send with every scrape of /metrics
  (docs/security.md, "Metrics"):

      kubectl -n estimator-serving create secret generic prometheus-scrape-token \\
          --from-file=token=FILE.prometheus

The tokens: one for clients (`predict,status`, named `clients`: predictions, model status,
metrics, the page's views), one for Prometheus (`status`, named `prometheus`: it reads
/metrics and cannot predict) and one `feedback` token per sender of labels (POST
/v1/models/{name}/feedback), each named by its `--sender` (`feedback-1` when none is given).
The feedback store records that name with each image, and the bounds on feedback (the rate,
the share of the store, what the retrain reads) are per name: a token handed to several
senders makes them one. `--add NAME` gives a new sender a token of its own later, appending
to both files. 43 random URL-safe characters each.

Standard library only: it runs with any python3, outside the project's virtualenv.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import secrets
import sys
from pathlib import Path

DEFAULT_FILE = "secrets/api-tokens"
# The operator's copy, with the tokens themselves: FILE + this.
ISSUED_SUFFIX = ".issued"
# The scrape token alone: FILE + this.
SCRAPE_SUFFIX = ".prometheus"
# 32 random bytes: 43 URL-safe characters (the service wants 16 or more).
TOKEN_BYTES = 32
# The clients' token, and each sender's scope.
CLIENTS = ("predict,status", "clients")
# Prometheus's token: /metrics (and the status routes) only.
SCRAPER = ("status", "prometheus")
FEEDBACK = "feedback"
DEFAULT_SENDERS = ("feedback-1",)
# A token's name, as the service takes it (artifact/feedback/: SENDER_PATTERN).
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}")
HEADER = "# <{}> <scope>[,<scope>] <name>: made by deploy/make_tokens.py"


def issued_path(path: Path) -> Path:
    """Where the tokens themselves go, beside the service's file."""
    return path.with_name(path.name + ISSUED_SUFFIX)


def scrape_token_path(path: Path) -> Path:
    """Where the scrape token alone goes, beside the service's file."""
    return path.with_name(path.name + SCRAPE_SUFFIX)


def check_name(name: str) -> str:
    """A sender's name as the service takes it.

    Raises:
        ValueError: it is not 1-64 letters, digits and _.@- starting with a letter or digit.
    """
    if not NAME_PATTERN.fullmatch(name):
        raise ValueError(
            f"a sender's name is 1-64 letters, digits and _.@- (starting with a letter or "
            f"digit), got {name!r}"
        )
    return name


def new_tokens(senders=DEFAULT_SENDERS) -> list[tuple[str, str, str]]:
    """(token, scopes, name): the clients', Prometheus's and one `feedback` token per sender,
    every token fresh and random.

    Raises:
        ValueError: a sender's name is not one the service takes, or is given twice.
    """
    names = [check_name(name) for name in senders]
    reserved = {CLIENTS[1], SCRAPER[1]}
    if len(set(names) | reserved) != len(names) + len(reserved):
        raise ValueError(
            f"each sender needs a name of its own (and not {' or '.join(map(repr, reserved))})"
        )
    lines = [CLIENTS, SCRAPER, *((FEEDBACK, name) for name in names)]
    return [(secrets.token_urlsafe(TOKEN_BYTES), scopes, name) for scopes, name in lines]


def service_text(tokens: list[tuple[str, str, str]]) -> str:
    """The service's AUTH_TOKENS_FILE: the tokens' sha256 digests, never the tokens."""
    lines = [HEADER.format("sha256 digest of the token") + "; the tokens: " + "*" + ISSUED_SUFFIX]
    lines += [digest_line(token, scopes, name) for token, scopes, name in tokens]
    return "\n".join(lines) + "\n"


def digest_line(token: str, scopes: str, name: str) -> str:
    return f"sha256:{hashlib.sha256(token.encode()).hexdigest()} {scopes} {name}"


def issued_text(tokens: list[tuple[str, str, str]]) -> str:
    """The operator's copy: the tokens themselves, to hand out (never mounted)."""
    lines = [HEADER.format("token") + "; hand each to its holder, never mount this file"]
    lines += [f"{token} {scopes} {name}" for token, scopes, name in tokens]
    return "\n".join(lines) + "\n"


def write_tokens(path: Path, senders=DEFAULT_SENDERS) -> Path:
    """Create `path` (digests), its `.issued` copy (the tokens) and `.prometheus` (the scrape
    token alone), mode 0600, their folder 0700 when made here, with the clients' token,
    Prometheus's and one feedback token per sender; the copy's path.

    Raises:
        FileExistsError: any exists; all are left as they were.
        ValueError: a sender's name (new_tokens).
    """
    issued, scrape = issued_path(path), scrape_token_path(path)
    for existing in (path, issued, scrape):
        if existing.exists():
            raise FileExistsError(existing)
    tokens = new_tokens(senders)
    (scrape_token,) = [token for token, scopes, name in tokens if (scopes, name) == SCRAPER]
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    # The tokens first: a file of digests whose tokens were lost would be of no use.
    written = ((issued, issued_text(tokens)), (scrape, scrape_token + "\n"),
               (path, service_text(tokens)))  # fmt: skip
    for target, text in written:
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
    return issued


def add_sender(path: Path, name: str) -> str:
    """Append a new sender's feedback token to `path` (its digest) and its `.issued` copy
    (the token); the token.

    Raises:
        FileNotFoundError: either file is missing.
        ValueError: the name is not one the service takes, or a token has it already.
    """
    issued = issued_path(path)
    for existing in (path, issued):
        if not existing.is_file():
            raise FileNotFoundError(existing)
    check_name(name)
    taken = {line.split()[2] for line in issued.read_text().splitlines()
             if line.strip() and not line.startswith("#") and len(line.split()) == 3}  # fmt: skip
    if name in taken:
        raise ValueError(f"a token is named {name!r} already: each sender needs a name of its own")
    token = secrets.token_urlsafe(TOKEN_BYTES)
    # The token first, then its digest: the service takes it only once both are written.
    for target, line in ((issued, f"{token} {FEEDBACK} {name}"),
                         (path, digest_line(token, FEEDBACK, name))):  # fmt: skip
        with open(target, "a", encoding="utf-8") as f:
            f.write(line + "\n")
    return token


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="make_tokens.py", description=__doc__.split("\n\n")[0].replace("\n", " ")
    )
    parser.add_argument("file", nargs="?", default=DEFAULT_FILE, help="default: %(default)s")
    parser.add_argument("--sender", action="append", metavar="NAME",
                        help="a sender of feedback, with a token of its own (repeat for each; "
                        f"default: {', '.join(DEFAULT_SENDERS)})")  # fmt: skip
    parser.add_argument("--add", metavar="NAME",
                        help="add one sender's token to existing files")  # fmt: skip
    args = parser.parse_args(argv)
    path = Path(args.file)
    if args.add is not None:
        try:
            add_sender(path, args.add)
        except (FileNotFoundError, ValueError) as err:
            print(f"error: {err}", file=sys.stderr)
            return 1
        print(f"Added the sender {args.add}: its digest to {path}, its token to "
              f"{issued_path(path)}")  # fmt: skip
        return 0
    try:
        issued = write_tokens(path, args.sender or DEFAULT_SENDERS)
    except FileExistsError as err:
        print(f"{err} exists: the files left as they are (remove them for new tokens)",
              file=sys.stderr)  # fmt: skip
        return 1
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    scrape = scrape_token_path(path)
    print(f"Wrote {path} (the service's: digests only), {issued} (the tokens to hand out)")
    print(f"and {scrape} (Prometheus's scrape token), mode 0600. Kubernetes:")
    print(
        f"  kubectl -n estimator-serving create secret generic api-tokens --from-file=tokens={path}"
    )
    print(
        "  kubectl -n estimator-serving create secret generic prometheus-scrape-token "
        f"--from-file=token={scrape}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Access control for HTTP: optional bearer tokens with scopes, cross-origin rules (CORS), and
the headers every answer carries.

- **Tokens** (AUTH_TOKENS_FILE): one per line, `<token> <scope>[,<scope>] [<name>]`, where the
  token is the token itself or its digest, `sha256:<64 hex digits>` (what `make tokens`
  writes: a reader of the file finds nothing to send); the scopes are
  `predict` (POST: predictions, inference), `feedback` (POST /v1/models/{name}/feedback:
  labels that train the next version) and `status` (GET: model status, metadata, metrics,
  the page's views). Each route says which it needs (service/routes.py), so a path spelled in
  another case (TF Serving's URL words match in any) needs its route's scope. Health and
  readiness probes, the page's own files and the API docs stay open. A missing or unknown
  token gets 401 with `WWW-Authenticate: Bearer`; a token without the scope 403. Only the
  sha256 digests of the tokens are kept in memory: a request's token is hashed and compared
  in constant time with every digest. The file is read again when it changes (`TokenFile`),
  so tokens rotate without a restart, and what it holds then is in force: a token removed, or
  on a line that cannot be used, is revoked.
- **Identity**: a request's sender is its token's name (`Decision.sender`), which the feedback
  store records with each image: the line's name, or `token-` and the first 8 hex digits of
  the token's sha256 when it has none; never the token. Two tokens may share a name (a
  rotation keeps the sender). Without AUTH_TOKENS_FILE every sender is `anonymous`.
- **Hosts**: a request is same-origin only when its `Host` is one this service answers for
  (HOST when it is a name or an address, the loopback names, ALLOWED_HOSTS): a page on
  another site whose name was made to resolve to this service (DNS rebinding) sends its own
  name as `Host`, and stays cross-origin. With ALLOWED_HOSTS set, or HOST a loopback
  address, a request for any other host is refused with 400 (Django's ALLOWED_HOSTS,
  Starlette's TrustedHostMiddleware; `enforces_hosts`); probes (/healthz, /readyz) are
  exempt, since kubelets address pods by IP.
- **Origins**: a browser request from another site (an `Origin` header that is neither this
  service's own nor in CORS_ALLOW_ORIGINS) is refused with 403 before it runs, so a
  cross-site form cannot post images here; allowed origins get CORS headers and preflights.
- **Headers**: `X-Content-Type-Options: nosniff` on every answer.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import ipaddress
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

import orjson
from starlette.responses import Response

from artifact.feedback import ANONYMOUS, SENDER_PATTERN

log = logging.getLogger("service.security")

PREDICT = "predict"
FEEDBACK = "feedback"
STATUS = "status"
SCOPES = (PREDICT, FEEDBACK, STATUS)
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", ""})
# How often, at most, AUTH_TOKENS_FILE is looked at for a change.
TOKENS_CHECK_SECONDS = 2.0
REALM = "estimator-serving"
CORS_HEADERS = "authorization, content-type, inference-header-content-length"
CORS_MAX_AGE = "600"
NOSNIFF = (b"x-content-type-options", b"nosniff")


class TokenFileError(ValueError):
    """AUTH_TOKENS_FILE cannot be used; the message names the line."""


class Scopes(frozenset):
    """A token's scopes, and `name`: who holds it (what the feedback store records)."""

    name: str

    def __new__(cls, scopes, name: str):
        self = super().__new__(cls, scopes)
        self.name = name
        return self


# A token's entry may be its digest instead: `sha256:` and 64 hex digits.
DIGEST_PREFIX = "sha256:"
_HEX_DIGEST = re.compile(r"[0-9a-f]{64}")


def token_digest(token: str | bytes) -> bytes:
    """The sha256 digest of a token, what is kept of it (a str is taken as UTF-8; a header's
    bytes as they came)."""
    return hashlib.sha256(token.encode() if isinstance(token, str) else token).digest()


def token_name(token: str) -> str:
    """The name of a token given none in its line: `token-` and 8 hex digits of its sha256
    (it tells tokens apart in records; it gives nothing of the token away)."""
    return _digest_name(token_digest(token))


def _digest_name(digest: bytes) -> str:
    return "token-" + digest.hex()[:8]


def _entry_digest(entry: str) -> bytes:
    """The digest a tokens file's first field stands for: its `sha256:` value, or the hash
    of the raw token it is."""
    if entry.startswith(DIGEST_PREFIX):
        return bytes.fromhex(entry.removeprefix(DIGEST_PREFIX))
    return token_digest(entry)


def parse_tokens(data: bytes, path: str | Path) -> tuple[dict[bytes, Scopes], list[str]]:
    """(token digest -> scopes, what is wrong with the lines left out) of an AUTH_TOKENS_FILE:
    every good line counts, each bad one is named (`<path>:<line>: why`) and left out."""
    tokens: dict[bytes, Scopes] = {}
    problems: list[str] = []
    for number, raw in enumerate(data.splitlines(), 1):
        try:
            line = raw.decode("utf-8").strip()
        except UnicodeDecodeError:
            problems.append(f"{path}:{number}: not UTF-8")
            continue
        if not line or line.startswith("#"):
            continue
        problem = _line_problem(line)
        if problem is not None:
            problems.append(f"{path}:{number}: {problem}")
            continue
        parts = line.split()
        digest = _entry_digest(parts[0])
        name = parts[2] if len(parts) == 3 else _digest_name(digest)
        tokens[digest] = Scopes(parts[1].split(","), name)
    return tokens, problems


def _line_problem(line: str) -> str | None:
    """What is wrong with one line of an AUTH_TOKENS_FILE; None when nothing is."""
    parts = line.split()
    if len(parts) not in (2, 3):
        return "expected `<token> <scope>[,<scope>] [<name>]`"
    token, scopes = parts[0], frozenset(parts[1].split(","))
    if token.lower().startswith(("sha256:", "sha512:", "sha1:", "md5:")):
        if not (token.startswith(DIGEST_PREFIX) and _HEX_DIGEST.fullmatch(token[7:])):
            return (
                f"a digest is `{DIGEST_PREFIX}` and 64 lowercase hex digits (a token's "
                f"sha256), got {token[:20]!r}..."
            )
    elif len(token) < 16:
        return "a token must have 16 characters or more"
    name = parts[2] if len(parts) == 3 else _digest_name(_entry_digest(token))
    if not SENDER_PATTERN.fullmatch(name):
        return (
            "a token's name is 1-64 letters, digits and _.@- (starting with a letter or "
            f"digit), got {name[:70]!r}"
        )
    unknown = sorted(scopes - set(SCOPES))
    if unknown:
        return f"unknown scope(s) {', '.join(unknown)}; the scopes are {', '.join(SCOPES)}"
    return None


def read_tokens(path: str | Path) -> dict[bytes, Scopes]:
    """token digest -> scopes (with the token's name) from an AUTH_TOKENS_FILE, every line
    good.

    Raises:
        TokenFileError: unreadable, a malformed line, an unknown scope, a bad name, or no
            token at all.
    """
    tokens, problems = _read(path)
    if problems:
        raise TokenFileError(problems[0])
    if not tokens:
        raise TokenFileError(f"{path}: holds no token")
    return tokens


def _read(path: str | Path) -> tuple[dict[bytes, Scopes], list[str]]:
    try:
        data = Path(path).read_bytes()
    except OSError as err:
        return {}, [f"{path}: cannot read it: {err.strerror or err}"]
    return parse_tokens(data, path)


class TokenFile(Mapping):
    """The tokens of AUTH_TOKENS_FILE (token digest -> scopes), read again when it changes.

    At most every `check_seconds` the file's identity (inode, size, modification time) is
    looked at; when it changed, the file is read again, and what it holds now is what is in
    force: revocation fails closed. A file emptied or gone revokes every token; a line that
    cannot be used revokes that line's (the others stay); each is said in one WARNING line
    (once per change). A Kubernetes Secret mounted as a volume changes by an atomic swap of
    its folder, which this sees as a new inode. HTTP (`Access`) and gRPC (`bearer_problem`)
    share one `TokenFile`.

    Raises:
        TokenFileError: at construction, the file cannot be used (every line must be good
            and one token at least there, as at start).
    """

    def __init__(
        self,
        path: str | Path,
        check_seconds: float = TOKENS_CHECK_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.path = Path(path)
        self.check_seconds = check_seconds
        self._clock = clock
        self._identity = self._stat()
        self._tokens = read_tokens(self.path)
        self._checked = clock()
        self._lock = threading.Lock()  # gRPC and HTTP may ask from different threads

    def _stat(self) -> tuple | None:
        try:
            info = os.stat(self.path)
        except OSError:
            return None
        return (info.st_ino, info.st_size, info.st_mtime_ns)

    def current(self) -> dict[bytes, Scopes]:
        """The tokens in force now (the file is read again first if it changed)."""
        now = self._clock()
        if now - self._checked < self.check_seconds:
            return self._tokens
        with self._lock:
            self._checked = now
            identity = self._stat()
            if identity == self._identity:
                return self._tokens
            tokens, problems = _read(self.path)
            revoked = len(set(self._tokens) - set(tokens))
            self._tokens, self._identity = tokens, identity
            if not tokens and not problems:
                problems = [f"{self.path}: holds no token"]
            if problems:
                log.warning(
                    "AUTH_TOKENS_FILE read again: %d tokens in force, %d revoked; every "
                    "token it does not hold is refused: %s",
                    len(tokens),
                    revoked,
                    "; ".join(problems[:5]) + ("; ..." if len(problems) > 5 else ""),
                )
            else:
                log.info("AUTH_TOKENS_FILE read again: %d tokens", len(tokens))
            return tokens

    def items(self):
        return self.current().items()

    def __getitem__(self, token: bytes) -> frozenset[str]:
        return self.current()[token]

    def __iter__(self):
        return iter(self.current())

    def __len__(self) -> int:
        return len(self.current())


MISSING, INVALID, SCOPE = "missing", "invalid", "scope"


def _granted(tokens: Mapping[bytes, frozenset[str]], token: bytes) -> frozenset[str] | None:
    """The scopes of a presented token: its digest compared with every digest (token digest
    -> scopes), in constant time, with no early exit to tell which matched."""
    digest = token_digest(token)
    scopes = None
    for known, known_scopes in tokens.items():
        if hmac.compare_digest(known, digest):
            scopes = known_scopes
    return scopes


def bearer_problem(
    tokens: Mapping[bytes, frozenset[str]], authorization: bytes, needed: str
) -> tuple[str, str] | None:
    """What is wrong with an `Authorization` header for a request needing a scope: None when
    nothing is, else (MISSING | INVALID | SCOPE, the message). HTTP and gRPC both ask this;
    `tokens` (token digest -> scopes) may be a `TokenFile` (taken once, as it is now)."""
    problem, _ = _bearer(tokens, authorization, needed)
    return problem


def _bearer(
    tokens: Mapping[bytes, frozenset[str]], authorization: bytes, needed: str
) -> tuple[tuple[str, str] | None, str]:
    """(bearer_problem's answer, the token's name when it is valid, else ANONYMOUS)."""
    kind, _, token = authorization.partition(b" ")
    if kind.lower() != b"bearer" or not token.strip():
        message = "this service needs a bearer token (Authorization: Bearer ...)"
        return (MISSING, message), ANONYMOUS
    scopes = _granted(tokens, token.strip())
    if scopes is None:
        return (INVALID, "the bearer token is not valid"), ANONYMOUS
    name = getattr(scopes, "name", None) or token_name(token.strip().decode("latin-1"))
    if needed not in scopes:
        return (SCOPE, f"the bearer token does not have the {needed!r} scope"), name
    return None, name


def scope_of(method: str) -> str:
    """The scope a request no route answers needs: it is told 404 only once its token could
    have read a route's answer (GET: status; any other method: predict)."""
    return STATUS if method in ("GET", "HEAD") else PREDICT


def is_loopback(host: str) -> bool:
    """Whether HOST is a loopback name or address (only this machine can connect)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def anonymous_refusal(host: str, tokens_file: str | None, allow_anonymous: bool) -> str | None:
    """Why the service must not start: no AUTH_TOKENS_FILE on a HOST other machines reach,
    unless ALLOW_ANONYMOUS says that is meant; None when it may start."""
    if tokens_file or allow_anonymous or is_loopback(host.strip("[]")):
        return None
    return (
        f"AUTH_TOKENS_FILE: not set, and HOST={host} lets other machines connect: predictions, "
        "feedback, metrics and version reports would answer anyone; set AUTH_TOKENS_FILE "
        "(`make tokens` writes one), bind a loopback HOST, or set ALLOW_ANONYMOUS=true to "
        "serve without tokens (docs/security.md)"
    )


def open_access_notice(host: str, tokens_file: str | None) -> tuple[int, str] | None:
    """The line said at start when no AUTH_TOKENS_FILE is set: (log level, message); None
    when tokens are on. On a loopback HOST that is the usual local setup (INFO); anywhere
    else (only with ALLOW_ANONYMOUS, `anonymous_refusal`) every endpoint answers anyone who
    can reach the port (WARNING)."""
    if tokens_file:
        return None
    if is_loopback(host):
        return logging.INFO, (
            f"No AUTH_TOKENS_FILE: every endpoint is open, to this machine only (HOST={host})"
        )
    return logging.WARNING, (
        f"No AUTH_TOKENS_FILE and HOST={host} (ALLOW_ANONYMOUS=true): predictions, feedback, "
        "metrics and version reports answer anyone who can reach this port"
    )


def host_name(host_header: bytes) -> str:
    """The name (or address) of a `Host` header, without its port, lowercased."""
    text = host_header.decode("latin-1").strip().lower()
    if text.startswith("["):  # [::1]:8000
        return text[1 : text.find("]")] if "]" in text else text
    if text.count(":") == 1:
        text = text.split(":", 1)[0]
    return text.rstrip(".")


def allowed_hosts(host: str, extra: Iterable[str]) -> frozenset[str]:
    """The host names a request's `Host` may name for it to be same-origin: HOST itself
    (unless it is a wildcard address), the loopback names (a page on another site cannot make
    a browser send them), and ALLOWED_HOSTS."""
    names = {name.strip().lower().rstrip(".") for name in extra if name.strip()}
    if host.strip("[]") not in WILDCARD_HOSTS:
        names.add(host.strip("[]").lower())
    return frozenset(names | LOOPBACK_NAMES)


def enforces_hosts(host: str, extra: Iterable[str]) -> bool:
    """Whether a request for a Host this service does not answer for is refused (400): when
    ALLOWED_HOSTS names some (`extra`), and, with none named, when HOST is a loopback
    address: only this machine connects, by a loopback name, and a page elsewhere whose name
    was made to resolve to 127.0.0.1 (DNS rebinding) sends its own (its GETs carry no
    Origin for the origin rule to refuse). `ALLOWED_HOSTS=*` answers any Host again."""
    return any(name.strip() for name in extra) or is_loopback(host.strip("[]"))


def _host_matches(name: str, patterns: frozenset[str]) -> bool:
    if name in patterns or "*" in patterns:
        return True
    # `.example.com` and `*.example.com` match example.com's subdomains (Django's and
    # Starlette's forms).
    suffixes = [p.lstrip("*") for p in patterns if p.startswith((".", "*."))]
    return any(name.endswith(suffix) or name == suffix[1:] for suffix in suffixes)


@dataclasses.dataclass(frozen=True)
class Decision:
    """What the access rules say of a request: an answer that ends it (a refusal, or a CORS
    preflight's), or None and the headers its answer must carry (CORS's); and who sent it
    (its token's name; ANONYMOUS without tokens)."""

    refusal: Response | None
    headers: list[tuple[bytes, bytes]]
    sender: str = ANONYMOUS


ALLOWED = Decision(None, [])


class Access:
    """Tokens, hosts and origins, for every HTTP request (service/door.py asks `check`).

    Args:
        tokens: token digest -> scopes (a `TokenFile`, or a dict); None when authentication is off.
        allowed_origins: origins (scheme://host[:port]) allowed to call from a browser.
        hosts: the host names this service answers for (`allowed_hosts`); None: any
            `Host` that equals the `Origin` is same-origin (tests of the rules alone).
        enforce_hosts: refuse (400) a request whose `Host` is not in `hosts` (ALLOWED_HOSTS
            is set).
    """

    def __init__(
        self,
        tokens: Mapping[bytes, frozenset[str]] | None,
        allowed_origins,
        hosts: Iterable[str] | None = None,
        enforce_hosts: bool = False,
    ):
        self.tokens = tokens
        self.allowed_origins = frozenset(allowed_origins)
        self.hosts = None if hosts is None else frozenset(hosts)
        self.enforce_hosts = enforce_hosts and self.hosts is not None

    def check(self, scope, needed: str | None, probe: bool = False) -> Decision:
        """The decision for an HTTP request (its ASGI scope: method and headers) to a route
        needing the token scope `needed` (None: open); a `probe` answers any Host."""
        if (
            self.tokens is None
            and not self.enforce_hosts
            and not any(name == b"origin" for name, _ in scope["headers"])
        ):
            return ALLOWED  # the usual case, decided without building a dict
        headers = dict(scope["headers"])
        if self.enforce_hosts and not probe:
            host = headers.get(b"host", b"")
            if self.hosts is not None and not _host_matches(host_name(host), self.hosts):
                message = (
                    f"the host {host.decode('latin-1')[:100]!r} is not one this service "
                    "answers for (ALLOWED_HOSTS)"
                )
                return Decision(_error(400, message), [])
        origin = headers.get(b"origin")
        cors: list[tuple[bytes, bytes]] = []
        if origin is not None and not self._same_origin(headers, origin):
            if origin.decode("latin-1") not in self.allowed_origins:
                message = (
                    f"cross-origin requests from {origin.decode('latin-1')[:100]!r} are not "
                    "allowed (CORS_ALLOW_ORIGINS)"
                )
                return Decision(_error(403, message), [])
            cors = [(b"access-control-allow-origin", origin), (b"vary", b"origin")]
            if scope["method"] == "OPTIONS" and b"access-control-request-method" in headers:
                return Decision(_preflight(), cors)
        if scope["method"] == "OPTIONS":
            needed = None  # a preflight carries no token (the request it asks about will)
        problem, sender = self._auth_problem(needed, headers)
        if problem is not None:
            status, message, challenge = problem
            return Decision(_error(status, message, [(b"www-authenticate", challenge)]), cors)
        return Decision(None, cors, sender)

    def _same_origin(self, headers, origin: bytes) -> bool:
        host = headers.get(b"host")
        if host is None or origin not in (b"http://" + host, b"https://" + host):
            return False
        # The Host names whatever the browser was pointed at: trusted only when it is a name
        # this service answers for (else a rebound name of another site would pass).
        return self.hosts is None or _host_matches(host_name(host), self.hosts)

    def _auth_problem(
        self, needed: str | None, headers
    ) -> tuple[tuple[int, str, bytes] | None, str]:
        """(the refusal's status, message and challenge, or None; the sender)."""
        if self.tokens is None:
            return None, ANONYMOUS
        if needed is None:
            return None, ANONYMOUS
        problem, name = _bearer(self.tokens, headers.get(b"authorization", b""), needed)
        if problem is None:
            return None, name
        kind, message = problem
        challenge = f'Bearer realm="{REALM}"'.encode()
        if kind == MISSING:
            return (401, message, challenge), ANONYMOUS
        if kind == INVALID:
            return (401, message, challenge + b', error="invalid_token"'), ANONYMOUS
        scope_challenge = challenge + f', error="insufficient_scope", scope="{needed}"'.encode()
        return (403, message, scope_challenge), name


def _error(status: int, message: str, headers: Sequence[tuple[bytes, bytes]] = ()) -> Response:
    response = Response(orjson.dumps({"error": message}), status, media_type="application/json")
    response.raw_headers.extend(headers)
    return response


def _preflight() -> Response:
    response = Response(b"", 204)
    response.raw_headers = [
        (b"access-control-allow-methods", b"GET, POST, OPTIONS"),
        (b"access-control-allow-headers", CORS_HEADERS.encode()),
        (b"access-control-max-age", CORS_MAX_AGE.encode()),
    ]
    return response

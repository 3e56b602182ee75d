"""Access control for HTTP: optional bearer tokens with scopes, cross-origin rules (CORS), and
the headers every answer carries.

- **Tokens** (AUTH_TOKENS_FILE): one per line, `<token> <scope>[,<scope>]`; the scopes are
  `predict` (POST: predictions, inference, feedback) and `status` (GET: model status,
  metadata, metrics, the page's views). Health and readiness probes, the page's own files and
  the API docs stay open. A missing or unknown token gets 401 with `WWW-Authenticate: Bearer`;
  a token without the scope 403. Tokens are compared in constant time, every one of them.
- **Origins**: a browser request from another site (an `Origin` header that is neither this
  service's own nor in CORS_ALLOW_ORIGINS) is refused with 403 before it runs, so a
  cross-site form cannot post images here; allowed origins get CORS headers and preflights.
- **Headers**: `X-Content-Type-Options: nosniff` on every answer.
"""

from __future__ import annotations

import dataclasses
import hmac
from pathlib import Path

import orjson
from starlette.responses import Response

PREDICT = "predict"
STATUS = "status"
SCOPES = (PREDICT, STATUS)
# Open without a token: probes, the page's own files and the API docs (no data in them).
OPEN_PATHS = ("/healthz", "/readyz", "/v2/health/live", "/v2/health/ready", "/", "/favicon.ico")
OPEN_PREFIXES = ("/static/", "/docs", "/openapi.json")
REALM = "estimator-serving"
CORS_HEADERS = "authorization, content-type, inference-header-content-length"
CORS_MAX_AGE = "600"
NOSNIFF = (b"x-content-type-options", b"nosniff")


class TokenFileError(ValueError):
    """AUTH_TOKENS_FILE cannot be used; the message names the line."""


def read_tokens(path: str | Path) -> dict[bytes, frozenset[str]]:
    """token -> scopes from an AUTH_TOKENS_FILE.

    Raises:
        TokenFileError: unreadable, a malformed line, an unknown scope, or no token at all.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise TokenFileError(f"{path}: cannot read it: {err}") from err
    tokens: dict[bytes, frozenset[str]] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        if len(parts) != 2:
            raise TokenFileError(f"{path}:{number}: expected `<token> <scope>[,<scope>]`")
        token, scopes = parts[0], frozenset(parts[1].split(","))
        unknown = sorted(scopes - set(SCOPES))
        if unknown:
            raise TokenFileError(
                f"{path}:{number}: unknown scope(s) {', '.join(unknown)}; the scopes are "
                f"{', '.join(SCOPES)}"
            )
        if len(token) < 16:
            raise TokenFileError(f"{path}:{number}: a token must have 16 characters or more")
        tokens[token.encode()] = scopes
    if not tokens:
        raise TokenFileError(f"{path}: holds no token")
    return tokens


MISSING, INVALID, SCOPE = "missing", "invalid", "scope"


def bearer_problem(
    tokens: dict[bytes, frozenset[str]], authorization: bytes, needed: str
) -> tuple[str, str] | None:
    """What is wrong with an `Authorization` header for a request needing a scope: None when
    nothing is, else (MISSING | INVALID | SCOPE, the message). HTTP and gRPC both ask this."""
    kind, _, token = authorization.partition(b" ")
    if kind.lower() != b"bearer" or not token.strip():
        return MISSING, "this service needs a bearer token (Authorization: Bearer ...)"
    scopes = None
    # Every token is compared, in constant time: no early exit tells which matched.
    for known, known_scopes in tokens.items():
        if hmac.compare_digest(known, token.strip()):
            scopes = known_scopes
    if scopes is None:
        return INVALID, "the bearer token is not valid"
    if needed not in scopes:
        return SCOPE, f"the bearer token does not have the {needed!r} scope"
    return None


def scope_of(method: str, path: str) -> str | None:
    """The scope a request needs, or None when it is open."""
    if path in OPEN_PATHS or path.startswith(OPEN_PREFIXES) or method == "OPTIONS":
        return None
    return PREDICT if method == "POST" else STATUS


@dataclasses.dataclass(frozen=True)
class Decision:
    """What the access rules say of a request: an answer that ends it (a refusal, or a CORS
    preflight's), or None and the headers its answer must carry (CORS's)."""

    refusal: Response | None
    headers: list[tuple[bytes, bytes]]


ALLOWED = Decision(None, [])


class Access:
    """Tokens and origins, for every HTTP request (service/door.py asks `check`).

    Args:
        tokens: token -> scopes; None when authentication is off.
        allowed_origins: origins (scheme://host[:port]) allowed to call from a browser.
    """

    def __init__(self, tokens: dict[bytes, frozenset[str]] | None, allowed_origins):
        self.tokens = tokens
        self.allowed_origins = frozenset(allowed_origins)

    def check(self, scope) -> Decision:
        """The decision for an HTTP request's scope (its method, path and headers)."""
        if self.tokens is None and not any(name == b"origin" for name, _ in scope["headers"]):
            return ALLOWED  # the usual case, decided without building a dict
        headers = dict(scope["headers"])
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
        problem = self._auth_problem(scope, headers)
        if problem is not None:
            status, message, challenge = problem
            return Decision(_error(status, message, [(b"www-authenticate", challenge)]), cors)
        return Decision(None, cors)

    @staticmethod
    def _same_origin(headers, origin: bytes) -> bool:
        host = headers.get(b"host")
        if host is None:
            return False
        return origin in (b"http://" + host, b"https://" + host)

    def _auth_problem(self, scope, headers) -> tuple[int, str, bytes] | None:
        if self.tokens is None:
            return None
        needed = scope_of(scope["method"], scope["path"])
        if needed is None:
            return None
        problem = bearer_problem(self.tokens, headers.get(b"authorization", b""), needed)
        if problem is None:
            return None
        kind, message = problem
        challenge = f'Bearer realm="{REALM}"'.encode()
        if kind == MISSING:
            return 401, message, challenge
        if kind == INVALID:
            return 401, message, challenge + b', error="invalid_token"'
        return 403, message, challenge + f', error="insufficient_scope", scope="{needed}"'.encode()


def _error(status: int, message: str, headers: list[tuple[bytes, bytes]] = ()) -> Response:
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

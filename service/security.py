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

import hmac
from pathlib import Path

import orjson

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


def _reply(status: int, message: str, headers: list[tuple[bytes, bytes]] = ()):
    body = orjson.dumps({"error": message})
    start = {
        "type": "http.response.start",
        "status": status,
        "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            *headers,
        ],
    }
    return start, {"type": "http.response.body", "body": body}


class SecurityMiddleware:
    """ASGI middleware: tokens, origins, CORS and nosniff, in front of every route.

    Args:
        app: the rest of the application.
        tokens: token -> scopes; None when authentication is off.
        allowed_origins: origins (scheme://host[:port]) allowed to call from a browser.
    """

    def __init__(self, app, tokens: dict[bytes, frozenset[str]] | None, allowed_origins):
        self.app = app
        self.tokens = tokens
        self.allowed_origins = frozenset(allowed_origins)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        origin = headers.get(b"origin")
        cors: list[tuple[bytes, bytes]] = []
        if origin is not None and not self._same_origin(scope, headers, origin):
            if origin.decode("latin-1") not in self.allowed_origins:
                await self._send(
                    send,
                    403,
                    f"cross-origin requests from {origin.decode('latin-1')[:100]!r} are not "
                    "allowed (CORS_ALLOW_ORIGINS)",
                )
                return
            cors = [(b"access-control-allow-origin", origin), (b"vary", b"origin")]
            if scope["method"] == "OPTIONS" and b"access-control-request-method" in headers:
                await self._preflight(send, cors)
                return
        problem = self._auth_problem(scope, headers)
        if problem is not None:
            status, message, challenge = problem
            await self._send(send, status, message, [(b"www-authenticate", challenge), *cors])
            return

        async def send_with_headers(message):
            if message["type"] == "http.response.start":
                present = {name.lower() for name, _ in message.get("headers", ())}
                extra = [] if b"x-content-type-options" in present else [NOSNIFF]
                message["headers"] = [*message.get("headers", ()), *extra, *cors]
            await send(message)

        await self.app(scope, receive, send_with_headers)

    @staticmethod
    def _same_origin(scope, headers, origin: bytes) -> bool:
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

    async def _preflight(self, send, cors) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": 204,
                "headers": [
                    *cors,
                    (b"access-control-allow-methods", b"GET, POST, OPTIONS"),
                    (b"access-control-allow-headers", CORS_HEADERS.encode()),
                    (b"access-control-max-age", CORS_MAX_AGE.encode()),
                    NOSNIFF,
                ],
            }
        )
        await send({"type": "http.response.body", "body": b""})

    @staticmethod
    async def _send(send, status: int, message: str, headers=()) -> None:
        start, body = _reply(status, message, [*headers, NOSNIFF])
        await send(start)
        await send(body)

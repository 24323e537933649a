"""What stands before the routes of `corescale serve`: the Host check (a loopback service without a key answers
only to loopback names: DNS rebinding), the API key, the body limit counted as the bytes arrive (TEI's
payload_limit), and a deadline for receiving a request (uvicorn has none: its keep-alive timer restarts with
every byte, so a client trickling one header byte every few seconds holds a connection for ever)."""

from __future__ import annotations

import functools
import hmac
import json

from fastapi.responses import JSONResponse

from corescale.measure.http.contract import is_loopback_host

DISCONNECTED = "the client disconnected before sending its whole body"
# the Host check's verdict per name, remembered (parsing the address was ~3 % of the front's samples per request);
# bounded: a client sending random names evicts only its own
loopback_name = functools.lru_cache(maxsize=256)(is_loopback_host)


class Refused(Exception):
    def __init__(self, status: int, message: str, kind: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.kind, self.headers = status, kind, headers or {}


def bearer(authorization: bytes) -> bytes:
    """The credentials of `Authorization: Bearer TOKEN` (the scheme case-insensitive, RFC 7235; spaces around
    tolerated), else nothing."""
    scheme, _, token = authorization.strip().partition(b" ")
    return token.strip() if scheme.lower() == b"bearer" else b""


def refusal(exc: Refused) -> JSONResponse:
    return JSONResponse({"error": str(exc), "error_type": exc.kind}, status_code=exc.status, headers=exc.headers)


def host_name(scope) -> str:
    """The Host header's name, without its port (and without an IPv6 address's brackets)."""
    host = dict(scope["headers"]).get(b"host", b"").decode("latin-1").strip().lower()
    if host.startswith("["):
        return host[1:host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


class Guard:
    """Plain ASGI middleware (no per-request task group), in this order: Host (when `loopback_only`), the key
    (every route but /health), the body's declared then received size."""

    def __init__(self, app, metrics, key: str | None, payload_bytes: int, loopback_only: bool) -> None:
        self.app, self.metrics, self.payload_bytes, self.loopback_only = app, metrics, payload_bytes, loopback_only
        self.expected = key.encode() if key else None  # the credentials of a Bearer Authorization header

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            self.check(scope)
        except Refused as refused:
            self.metrics.answered(scope["path"], refused.status)
            await refusal(refused)(scope, receive, send)
            return
        limit, received = self.payload_bytes, 0

        async def counted():
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > limit:  # the endpoint reading the body gets it; the handlers answer 413
                raise self.too_large()
            return message
        await self.app(scope, counted, send)

    def too_large(self) -> Refused:
        return Refused(413, f"the body passed {self.payload_bytes} bytes (--payload-limit)", "Validation")

    async def body(self, receive) -> bytes:
        """The request's body, counted as it arrives (413 past the limit; 400 when the client leaves first): the
        computed routes' fast path reads it so (serve/app.py's Served), the others through `counted` above."""
        chunks, received = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":  # gone before its body arrived (cut at --receive-timeout)
                raise Refused(400, DISCONNECTED, "Validation")
            chunk = message.get("body", b"")
            received += len(chunk)
            if received > self.payload_bytes:
                raise self.too_large()
            chunks.append(chunk)
            if not message.get("more_body", False):
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def check(self, scope) -> None:
        if self.loopback_only and not loopback_name(host_name(scope) or "localhost"):  # HTTP/1.0 may send none
            raise Refused(400, "this service listens on loopback without an API key and answers only to loopback "
                               "host names (Host: localhost or 127.0.0.1)", "Validation")
        headers = dict(scope["headers"])
        if self.expected is not None and scope["path"] != "/health" and \
                not hmac.compare_digest(bearer(headers.get(b"authorization", b"")), self.expected):
            raise Refused(401, "a valid API key is required (Authorization: Bearer KEY)", "Unauthorized")
        declared = headers.get(b"content-length")
        if declared is not None and (not declared.strip().isdigit() or int(declared) > self.payload_bytes):
            raise Refused(413, f"the body declares {declared.decode('latin-1')[:20]} bytes; at most "
                               f"{self.payload_bytes} (--payload-limit)", "Validation")


FIRST_BYTES_S = 5.0  # a connection's first bytes (of each request on a kept-alive one) must come within this
HEALTH = b"/health"  # the probe: answered past the connection limit


def deadline_protocol(receive_s: float, header_bytes: int) -> type:
    """uvicorn's HTTP protocol (httptools' C parser where installed, else h11's pure-Python one: a tenth of the
    front's CPU per request, profiled in docs/serve-profile.md) with a deadline: a request's headers and body must
    arrive within `receive_s` of the connection opening (or of the previous answer, on a kept-alive connection),
    and their first bytes within FIRST_BYTES_S, else the connection is closed (idle connections cannot hold the
    connection limit for long); `GET /health` is answered past the connection limit (uvicorn's
    `limit_concurrency`), so a probe survives a flood. A request received in full is never cut, however long its
    answer takes. The request line and headers are bounded by `header_bytes` (past it: 400 in the documented body,
    and closed)."""
    base: type
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
        base = HttpToolsProtocol
    except ImportError:  # httptools is not installed: h11 bounds the headers itself
        from uvicorn.protocols.http.h11_impl import H11Protocol
        base = H11Protocol

    first_s = min(FIRST_BYTES_S, receive_s)

    class Deadlined(base):
        heading = 0  # bytes of the current request's line and headers so far; -1 once they are complete

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self.opened = self.loop.time()
            self.receipt = self.loop.call_later(first_s, self.too_slow)  # its first bytes, soon

        def data_received(self, data: bytes) -> None:  # httptools only (h11 bounds its own buffer)
            if self.heading == 0 and data:  # a request's first bytes: the rest within receive_s of the start
                self.receipt.cancel()
                self.receipt = self.loop.call_at(self.opened + receive_s, self.too_slow)
            if self.heading >= 0:  # counted before parsing: headers complete in one read are bounded too
                end = data.find(b"\r\n\r\n")
                self.heading += len(data) if end < 0 else end + 4
                if self.heading > header_bytes:
                    self.send_400_response(f"the request line and headers passed {header_bytes} bytes")
                    return
            super().data_received(data)

        def on_headers_complete(self) -> None:
            self.heading = -1  # the body follows: not counted
            probe = getattr(self, "url", b"").split(b"?", 1)[0] == HEALTH
            limit = self.limit_concurrency  # type: ignore[has-type]
            if probe:  # a probe is answered whatever the connections: a flood must not get the pod restarted
                self.limit_concurrency = None
            try:
                super().on_headers_complete()
            finally:
                self.limit_concurrency = limit

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self.heading = 0  # what comes next on a kept-alive connection is a new request's line and headers
            self.receipt.cancel()
            if not self.transport.is_closing():
                self.opened = self.loop.time()
                self.receipt = self.loop.call_later(first_s, self.too_slow)

        def connection_lost(self, exc) -> None:
            self.receipt.cancel()
            super().connection_lost(exc)

        def too_slow(self) -> None:
            cycle = self.cycle
            receiving = cycle is None or cycle.response_complete or cycle.more_body
            if receiving and not self.transport.is_closing():
                self.transport.close()

        def send_400_response(self, msg: str) -> None:
            """A request the parser refuses (headers past the limit, malformed): the documented body."""
            if self.transport.is_closing():
                return
            body = json.dumps({"error": msg, "error_type": "Validation"}).encode()
            self.transport.write(b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\n"
                                 b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body))
            self.transport.close()

    if base.__name__ == "H11Protocol":  # h11 bounds its own buffer (h11_max_incomplete_event_size)
        Deadlined.data_received = base.data_received  # type: ignore[method-assign]
    return Deadlined

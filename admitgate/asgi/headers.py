"""Response headers and the problem body for gate decisions.

Rejections carry:

* ``Retry-After: <n>``: delay-seconds, always a positive integer (RFC 9110 §10.2.3);
  urllib3 and httpx-retries sleep exactly this value and mishandle ``0`` and decimals.
* ``RateLimit-Policy: "<name>";q=<quota>;w=<window>`` and ``RateLimit: "<name>";r=0;t=<n>``,
  structured fields of draft-ietf-httpapi-ratelimit-headers-11: ``r`` the available quota, ``t`` the
  effective window (the seconds within which the client can use no more than ``r``). On a rejection ``t``
  equals Retry-After, so Retry-After never names a time before the window's end (draft §6), and a client
  that reads both keeps to Retry-After, which the draft makes authoritative (§7).
* optionally legacy ``X-RateLimit-Limit/-Remaining/-Reset``; our ``X-RateLimit-Reset``
  is a *delta in seconds* (like ``t``), not the epoch timestamp some libraries send.
* ``Access-Control-Expose-Headers`` naming them, so browser code can read them, and
  ``Cache-Control: no-store`` (a 429 must not be cached, RFC 6585 §4).

The body is ``application/problem+json`` (RFC 9457) with the draft's problem types, unless the
policy's ``body`` hook renders the app's own error format.
Quota ``q`` per window ``w`` describes the rate at hand: on a 429 the headroom H returning clients are
scheduled at, on an admitted response (``on_admit``) the rate its bucket refills at (μ, or a tenant's
entitlement). ``w`` is the smallest whole number of seconds in which at least one request is allowed,
``q = floor(rate * w)``.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Iterable, Sequence

from ..core.errors import ConfigError, flag

Header = tuple[bytes, bytes]
#: ``body(status, retry_after, policy_name) -> (body bytes, content type)``: a rejection's body in the app's format.
BodyHook = Callable[[int, int, str], tuple[bytes, str]]

PROBLEM_JSON = "application/problem+json"
EXPOSE = b"access-control-expose-headers"
log = logging.getLogger("admitgate")

QUOTA_EXCEEDED = "https://iana.org/assignments/http-problem-types#quota-exceeded"
REDUCED_CAPACITY = "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity"
_TITLES = {429: "Too Many Requests", 503: "Service Unavailable"}


def sf_string(value: str) -> str:
    """Serialise ``value`` as a structured-field String (RFC 9651 §4.1.6)."""
    if any(not 0x20 <= ord(ch) <= 0x7E for ch in value):
        raise ConfigError("policy_name", "must be printable ASCII", value)
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def quota(rate: float) -> tuple[int, int]:
    """``(q, w)`` for a rate in requests/s: integers, ``w >= 1``, ``q >= 1``."""
    if rate >= 1.0:
        return int(rate), 1
    window = math.ceil(1.0 / rate - 1e-9)
    return max(1, int(rate * window + 1e-9)), window


class HeaderPolicy:
    """Renders rate-limit headers; built once, cheap per response.

    ``policy_name``: the draft's policy name. ``draft``: send ``RateLimit``/``RateLimit-Policy``.
    ``legacy``: also send ``X-RateLimit-*``. ``on_admit``: also put the rate-limit fields on
    admitted responses. ``status``: 429 (default) or 503 for rejections. ``body``: a :data:`BodyHook`
    for apps that must keep their own error format; it is called once per distinct rejection (the
    rendering is cached), so it must depend on its arguments only. It is tried once at construction;
    if it later fails, the rejection falls back to the problem document and a warning is logged.
    """

    __slots__ = ("_expose", "_name", "_policy_cache", "_rejections", "body", "draft", "exposed", "legacy",
                 "on_admit", "policy_name", "status")  # fmt: skip

    def __init__(
        self,
        *,
        policy_name: str = "admitgate",
        draft: bool = True,
        legacy: bool = False,
        on_admit: bool = False,
        status: int = 429,
        body: BodyHook | None = None,
    ) -> None:
        if not isinstance(status, int) or isinstance(status, bool) or status not in _TITLES:
            raise ConfigError("status", "must be 429 or 503", status)
        for name, value in (("draft", draft), ("legacy", legacy), ("on_admit", on_admit)):
            flag(name, value)
        if not isinstance(policy_name, str) or not policy_name:
            raise ConfigError("policy_name", "must be a non-empty string", policy_name)
        if body is not None:
            if not callable(body):
                raise ConfigError("body", "must be a callable (status, retry_after, policy_name) -> (bytes, str)", body)
            try:
                _checked_body(body(status, 1, policy_name))
            except Exception as exc:
                raise ConfigError("body", f"the hook failed on (status={status}, retry_after=1): {exc!r}") from exc
        self.body = body
        self._name = sf_string(policy_name)
        self.policy_name = policy_name
        self.draft, self.legacy, self.on_admit, self.status = draft, legacy, on_admit, status
        exposed = ["Retry-After"]
        if draft:
            exposed += ["RateLimit", "RateLimit-Policy"]
        if legacy:
            exposed += ["X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset"]
        self.exposed: tuple[str, ...] = tuple(exposed)  #: the fields browser code may read (Retry-After first)
        self._expose = ", ".join(exposed).encode()
        self._policy_cache: tuple[float, bytes, bytes] = (-1.0, b"", b"")
        self._rejections: dict[tuple[int, float], tuple[list[Header], bytes]] = {}

    def _policy(self, rate: float) -> tuple[bytes, bytes]:
        cached = self._policy_cache
        if cached[0] != rate:
            q, w = quota(rate)
            cached = (rate, f"{self._name};q={q};w={w}".encode(), str(q).encode())
            self._policy_cache = cached
        return cached[1], cached[2]

    def limit_fields(self, rate: float, remaining: int, reset: int | None) -> list[Header]:
        """The rate-limit fields: ``remaining`` requests available now, and ``reset``, the effective window: the
        seconds within which no more than ``remaining`` can be used (None: more comes back at once, no window)."""
        out: list[Header] = []
        policy, limit = self._policy(rate)
        if self.draft:
            out.append((b"ratelimit-policy", policy))
            tail = "" if reset is None else f";t={reset}"
            out.append((b"ratelimit", f"{self._name};r={remaining}{tail}".encode()))
        if self.legacy:
            out.append((b"x-ratelimit-limit", limit))
            out.append((b"x-ratelimit-remaining", str(remaining).encode()))
            out.append((b"x-ratelimit-reset", str(0 if reset is None else reset).encode()))
        return out

    def rejection(self, retry_after: int, rate: float) -> tuple[list[Header], bytes]:
        """Headers and body for a rejection with a ``retry_after`` of whole seconds (>= 1).

        Both depend only on (retry_after, rate), so they are rendered once and reused (a herd gets
        thousands of 429s a second); the cache is cleared when it passes 1,024 entries. The
        returned list is a fresh copy that the caller may extend.
        """
        cached = self._rejections.get((retry_after, rate))
        if cached is None:
            if len(self._rejections) >= 1024:
                self._rejections.clear()
            cached = self._rejections[(retry_after, rate)] = self._render_rejection(retry_after, rate)
        return list(cached[0]), cached[1]

    def _render_rejection(self, retry_after: int, rate: float) -> tuple[list[Header], bytes]:
        body, content_type = self._body(retry_after)
        headers = [
            (b"content-type", content_type.encode()),
            (b"content-length", str(len(body)).encode()),
            (b"retry-after", str(retry_after).encode()),
            (b"cache-control", b"no-store"),
            *self.limit_fields(rate, 0, retry_after),
            (EXPOSE, self._expose),
        ]
        return headers, body

    def quota_fields(self, counted: Sequence[tuple[str, int, int, int, int]]) -> list[Header]:
        """The draft's fields of the quota windows a request was counted in, each ``(name, limit, window,
        remaining, reset)``: ``limit`` requests per ``window`` s, ``remaining`` at once, no more than that within
        ``reset`` s (the effective window).
        One field line each, listing every window (the draft's fields are lists; nothing without ``draft``)."""
        if not self.draft or not counted:
            return []
        policies = ", ".join(f"{sf_string(name)};q={limit};w={window}" for name, limit, window, _, _ in counted)
        states = ", ".join(f"{sf_string(name)};r={remaining};t={reset}" for name, _, _, remaining, reset in counted)
        return [(b"ratelimit-policy", policies.encode()), (b"ratelimit", states.encode())]

    def quota_rejection(self, retry_after: int, name: str, limit: int, window: int) -> tuple[list[Header], bytes]:
        """Headers and body for a request over its key's quota of ``limit`` requests per ``window`` s: the
        rejection's status and fields, with the quota's policy ``name``, ``q=limit;w=window``, ``r=0`` and
        ``t=retry_after`` (rendered per call: a quota's refusals are not a herd's)."""
        sf_name = sf_string(name)
        body, content_type = self._body(retry_after, name)
        headers = [(b"content-type", content_type.encode()), (b"content-length", str(len(body)).encode()),
                   (b"retry-after", str(retry_after).encode()), (b"cache-control", b"no-store")]  # fmt: skip
        if self.draft:
            headers.append((b"ratelimit-policy", f"{sf_name};q={limit};w={window}".encode()))
            headers.append((b"ratelimit", f"{sf_name};r=0;t={retry_after}".encode()))
        if self.legacy:
            headers += [(b"x-ratelimit-limit", str(limit).encode()), (b"x-ratelimit-remaining", b"0"),
                        (b"x-ratelimit-reset", str(retry_after).encode())]  # fmt: skip
        headers.append((EXPOSE, self._expose))
        return headers, body

    def _body(self, retry_after: int, policy_name: str | None = None) -> tuple[bytes, str]:
        name = self.policy_name if policy_name is None else policy_name
        if self.body is not None:
            try:
                return _checked_body(self.body(self.status, retry_after, name))
            except Exception:  # a rejection must still go out: a 500 in a herd would be worse
                log.warning("admitgate: the 429 body hook failed; sending the problem document", exc_info=True)
        return problem_body(self.status, retry_after, name, quota=policy_name is not None), PROBLEM_JSON


def merge_names(first: Iterable[str], then: Iterable[str]) -> list[str]:
    """The field names of ``first``, then those of ``then`` not among them (names compare case-insensitively)."""
    merged: list[str] = []
    seen: set[str] = set()
    for field in (*first, *then):
        field = field.strip()
        if field and field.lower() not in seen:
            seen.add(field.lower())
            merged.append(field)
    return merged


def merge_expose(headers: Sequence[Header], names: Sequence[str]) -> list[Header]:
    """``headers`` with ``names`` added to their Access-Control-Expose-Headers, as one field.

    Another layer (the app's CORS middleware) may have put its own list there; two fields would also
    reach a browser combined, but one list is what every cache and proxy reads the same way.
    """
    out: list[Header] = []
    present: list[str] = []
    for name, value in headers:
        if name.lower() == EXPOSE:
            present += value.decode("latin-1").split(",")
        else:
            out.append((name, value))
    out.append((EXPOSE, ", ".join(merge_names(present, names)).encode("latin-1")))
    return out


def _checked_body(result: object) -> tuple[bytes, str]:
    """A hook's ``(body, content_type)``, or ConfigError: bytes, and a content type fit for a header."""
    if not (isinstance(result, tuple) and len(result) == 2):
        raise ConfigError("body", "the hook must return (body bytes, content type)", result)
    body, content_type = result
    if not isinstance(body, (bytes, bytearray)):
        raise ConfigError("body", "the body must be bytes", type(body).__name__)
    if not isinstance(content_type, str) or not content_type or any(not 0x20 <= ord(c) <= 0x7E for c in content_type):
        raise ConfigError("body", "the content type must be non-empty printable ASCII", content_type)
    return bytes(body), content_type


def problem_body(status: int, retry_after: int, policy: str = "admitgate", *, quota: bool = False) -> bytes:
    """An RFC 9457 problem document for a rejection (``quota``: the client's quota is used up)."""
    reason = "Your quota is used up" if quota else "The service is at capacity"
    doc = {
        "type": QUOTA_EXCEEDED if status == 429 else REDUCED_CAPACITY,
        "title": _TITLES[status],
        "status": status,
        "detail": f"{reason}; retry in {retry_after} s.",
        "retry-after": retry_after,
        "violated-policies": [policy],
    }
    return json.dumps(doc, separators=(",", ":")).encode()

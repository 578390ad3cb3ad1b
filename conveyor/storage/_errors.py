"""What went wrong with object storage, in words that name it and show no secret.

``classify`` sorts a failure into a kind (``transient``: retry it; ``not_found``; ``no_bucket``;
``denied``; ``permanent``), looking through the exception's causes (s3fs turns botocore's
``ClientError`` into ``OSError`` and keeps it as the cause) for the server's error code or HTTP
status. ``describe`` gives a one-line ``Type: message [Code]``. ``redact`` replaces the secret
values it knows (from ``storage_options`` and the AWS environment variables) and URL passwords
with ``***``; every message ``conveyor.storage`` builds goes through it.
"""

from __future__ import annotations

import asyncio
import http.client
import os
import re
from typing import Any

TRANSIENT, NOT_FOUND, NO_BUCKET, DENIED, PERMANENT = (
    "transient", "not_found", "no_bucket", "denied", "permanent")

_TRANSIENT_CODES = frozenset({
    "InternalError", "ServiceUnavailable", "SlowDown", "Throttling", "ThrottlingException",
    "ThrottledException", "RequestThrottled", "RequestThrottledException", "TooManyRequests",
    "TooManyRequestsException", "RequestLimitExceeded", "BandwidthLimitExceeded",
    "ProvisionedThroughputExceededException", "RequestTimeout", "RequestTimeoutException",
    "PriorRequestNotComplete", "OperationAborted", "500", "502", "503", "504", "429",
})
_DENIED_CODES = frozenset({
    "AccessDenied", "AllAccessDisabled", "InvalidAccessKeyId", "SignatureDoesNotMatch",
    "ExpiredToken", "InvalidToken", "AccountProblem", "InvalidSecurity", "403", "401",
})
_NOT_FOUND_CODES = frozenset({"NoSuchKey", "NotFound", "404", "NoSuchVersion"})
# botocore's failures to find or refresh credentials, before any request is made: the whole
# source is unusable, as with denied access (by name: botocore is optional)
_NO_CREDENTIALS = frozenset({
    "NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError", "NoAuthTokenError",
    "TokenRetrievalError", "UnauthorizedSSOTokenError", "SSOTokenLoadError", "UnknownCredentialError",
})
_SECRET_NAME = re.compile(r"secret|token|passw|credential|sas|private|(^|_)key$|^key$", re.I)
_URL_PASSWORD = re.compile(r"(\b[a-z][a-z0-9+.-]*://[^/\s:@]*):([^@/\s]+)@", re.I)


def secret_values(storage_options: dict[str, Any] | None) -> set[str]:
    """The values in ``storage_options`` (nested too) whose names look secret, and the
    AWS secret variables of the environment."""
    found: set[str] = set()

    def walk(obj: Any, name: str = "") -> None:
        if isinstance(obj, dict):
            for k, v in obj.items():
                walk(v, str(k))
        elif isinstance(obj, (list, tuple)):
            for v in obj:
                walk(v, name)
        elif isinstance(obj, str) and len(obj) >= 4 and _SECRET_NAME.search(name):
            found.add(obj)

    walk(storage_options or {})
    for var in ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"):
        value = os.environ.get(var)
        if value and len(value) >= 4:
            found.add(value)
    return found


def redact(text: str, storage_options: dict[str, Any] | None = None) -> str:
    """``text`` with known secret values and URL passwords replaced by ``***``.

    Example:
        >>> redact("key abcd1234 at s3://u:pw@host/x", {"secret": "abcd1234"})
        'key *** at s3://u:***@host/x'
    """
    for value in sorted(secret_values(storage_options), key=len, reverse=True):
        text = text.replace(value, "***")
    return _URL_PASSWORD.sub(r"\1:***@", text)


# ----- error kinds ------------------------------------------------------------------------

def _chain(exc: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    e: BaseException | None = exc
    while e is not None and e not in out and len(out) < 8:
        out.append(e)
        e = e.__cause__ or e.__context__
    return out


def _code_status(exc: BaseException) -> tuple[str | None, int | None]:
    resp = getattr(exc, "response", None)
    if isinstance(resp, dict):
        err = resp.get("Error") or {}
        meta = resp.get("ResponseMetadata") or {}
        code = err.get("Code")
        return (str(code) if code is not None else None), meta.get("HTTPStatusCode")
    status = getattr(exc, "status", None)  # aiohttp.ClientResponseError
    return None, status if isinstance(status, int) else None


def _transient_types() -> tuple[type, ...]:
    types: list[type] = [TimeoutError, ConnectionError, http.client.IncompleteRead,
                         http.client.BadStatusLine, asyncio.TimeoutError]
    try:
        import aiohttp

        types.append(aiohttp.ClientError)
    except ImportError:  # aiohttp comes with s3fs; without it there is nothing of it to catch
        pass
    try:
        from botocore import exceptions as be

        types += [be.HTTPClientError, be.ConnectionError, be.IncompleteReadError]
        parser = getattr(__import__("botocore.parsers", fromlist=["ResponseParserError"]),
                         "ResponseParserError", None)
        if parser is not None:
            types.append(parser)
    except ImportError:  # botocore comes with s3fs only
        pass
    return tuple(types)


_TRANSIENT_TYPES: tuple[type, ...] | None = None


def classify(exc: BaseException) -> str:
    """The kind of a storage failure: ``transient`` (retry it), ``not_found`` (no such object),
    ``no_bucket``, ``denied`` or ``permanent``.

    Looks through the exception's causes: s3fs turns botocore's ``ClientError`` into
    ``OSError``/``FileNotFoundError``/``PermissionError`` and keeps it as the cause.
    """
    global _TRANSIENT_TYPES
    if _TRANSIENT_TYPES is None:
        _TRANSIENT_TYPES = _transient_types()
    chain = _chain(exc)
    for e in chain:
        code, status = _code_status(e)
        if code == "NoSuchBucket":
            return NO_BUCKET
        if code in _TRANSIENT_CODES or (status is not None and (status >= 500 or status == 429)):
            return TRANSIENT
        if code in _DENIED_CODES or status in (401, 403):
            return DENIED
        if code in _NOT_FOUND_CODES or status == 404:
            return NOT_FOUND
        if code is not None or status is not None:
            return PERMANENT
    for e in chain:
        if type(e).__name__ in _NO_CREDENTIALS:
            return DENIED
        if isinstance(e, FileNotFoundError):
            return NOT_FOUND
        if isinstance(e, PermissionError):
            return DENIED
        if isinstance(e, _TRANSIENT_TYPES):
            return TRANSIENT
    return PERMANENT


_NO_CONNECTION = frozenset({"EndpointConnectionError", "ClientConnectorError", "ClientConnectorDNSError",
                            "ConnectionRefusedError", "gaierror"})


def no_connection(exc: BaseException) -> bool:
    """Whether the failure is not reaching the endpoint at all (connection refused, a host
    name that does not resolve): about the server, never about the object asked for."""
    return any(type(e).__name__ in _NO_CONNECTION for e in _chain(exc))


def no_credentials(exc: BaseException) -> bool:
    """Whether the failure is botocore finding no credentials (none set, a profile without
    keys, an expired SSO token), not a server refusing the ones it was given."""
    return any(type(e).__name__ in _NO_CREDENTIALS for e in _chain(exc))


def describe(exc: BaseException, storage_options: dict[str, Any] | None = None) -> str:
    """A one-line, redacted ``Type: message`` of a failure, with the server's error code."""
    code = next((c for c, _ in map(_code_status, _chain(exc)) if c), None)
    text = f"{type(exc).__name__}: {exc}".strip().rstrip(":")
    if code and code not in text:
        text += f" [{code}]"
    return redact(text, storage_options)

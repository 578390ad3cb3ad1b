"""From a URL to an fsspec filesystem: its protocol, the ``storage_options`` it takes, and S3
with the library's own retries turned down to one attempt, so that the retry policy is ours.

s3fs and botocore retry on their own; for filesystems made here both are turned down to a
single attempt (s3fs ``retries``, botocore ``total_max_attempts``) so that every retry is
``Storage``'s and is counted. Socket timeouts come from ``RetryPolicy.timeout`` unless the
spec's ``storage_options.config_kwargs`` sets them. An option the filesystem does not take is
a ``SourceError`` with a did-you-mean, before any request (s3fs would hand it to
aiobotocore's session, which fails with a TypeError deep in the first request).
"""

from __future__ import annotations

from typing import Any

import fsspec

from conveyor.errors import SourceError, did_you_mean
from conveyor.storage._errors import redact
from conveyor.storage._policy import RetryPolicy


def protocol_of(url: str) -> str:
    return url.split("://", 1)[0].split("::")[-1] if "://" in url else "file"


def is_local(url: str) -> bool:
    return protocol_of(url) in ("file", "local")


# ----- storage_options that the filesystem cannot take ------------------------------------

# s3fs hands every option it does not name to aiobotocore's session, which fails with a
# TypeError deep in the first request; these are all the names that chain accepts.
_FSSPEC_OPTIONS = ("skip_instance_cache", "use_listings_cache", "listings_expiry_time", "max_paths",
                   "batch_size", "asynchronous", "loop")


def _parameters(*refs: str) -> set[str]:
    import importlib
    import inspect

    names: set[str] = set()
    for ref in refs:
        module, _, attr = ref.partition(":")
        try:
            obj: Any = importlib.import_module(module)
            for part in attr.split("."):
                obj = getattr(obj, part)
            params = inspect.signature(obj).parameters.values()
        except (ImportError, AttributeError, TypeError, ValueError):  # not installed: nothing to check
            return set()
        names |= {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return names - {"self"}


_KNOWN: dict[str, set[str]] = {}


def known_options(protocol: str) -> set[str]:
    """The ``storage_options`` the filesystem of ``protocol`` takes, where that is known (S3);
    an empty set where it is not (then nothing is checked)."""
    if protocol not in ("s3", "s3a"):
        return set()
    if "s3" not in _KNOWN:
        names = _parameters("s3fs:S3FileSystem.__init__", "aiobotocore.session:AioSession.__init__")
        _KNOWN["s3"] = names | set(_FSSPEC_OPTIONS) if names else set()
    return _KNOWN["s3"]


def unknown_options(protocol: str, options: Any) -> list[tuple[str, str]]:
    """``(key, hint)`` for each key of ``options`` that the filesystem of ``protocol`` does not
    take; ``hint`` is a did-you-mean (or the list of what it takes)."""
    known = known_options(protocol)
    if not known or not isinstance(options, dict):
        return []
    out = []
    for key in options:
        if key not in known:
            main = [k for k in sorted(known) if k in ("key", "secret", "token", "endpoint_url", "anon",
                                                      "client_kwargs", "config_kwargs", "profile")]
            out.append((str(key), did_you_mean(str(key), sorted(known))
                        or f"; it takes {', '.join(main)}, ..."))
    return out


# ----- filesystems ------------------------------------------------------------------------

def _s3_options(options: dict[str, Any], policy: RetryPolicy) -> dict[str, Any]:
    config = {"connect_timeout": min(policy.timeout, 10.0), "read_timeout": policy.timeout,
              "retries": {"total_max_attempts": 1}, "max_pool_connections": 128}
    config.update(options.get("config_kwargs") or {})
    # no listings cache: a listing filled it, and an object's size (read_tar's, read_parquet's
    # first request) then came from there, stale once the object was replaced (shards packed
    # again into the same folder); every listing here is a fresh one anyway
    return {"use_listings_cache": False, **options, "config_kwargs": config,
            "max_concurrency": options.get("max_concurrency", 1)}


def missing_package(protocol: str) -> str | None:
    """Why ``protocol``'s filesystem cannot be made here, with the install line (``gs``: gcsfs
    not installed: ``pip install gcsfs``), or None where it can (or fsspec knows no such
    protocol: that is the URL's own error, met when it is read)."""
    try:
        fsspec.get_filesystem_class(protocol)
    except ImportError as exc:
        from fsspec.registry import known_implementations

        known = known_implementations.get(protocol, {})
        package = str(known.get("class", "")).split(".")[0]
        install = f"pip install {package}" if package else "install the package fsspec names"
        return (f"the {protocol}:// filesystem needs a package that is not installed ({exc}): "
                f"{install}")
    except (ValueError, KeyError):
        return None
    return None


def filesystem(url: str, storage_options: dict[str, Any] | None = None,
               policy: RetryPolicy | None = None) -> tuple[Any, str]:
    """``(fs, path)`` for ``url``; for S3 with the library's own retries turned off (see above)."""
    options = dict(storage_options or {})
    protocol = protocol_of(url)
    bad = unknown_options(protocol, options)
    if bad:
        raise SourceError("; ".join(f"storage_options: {protocol} has no option '{k}'{hint}" for k, hint in bad)
                          + f" (reading {redact(url, options)})")
    if protocol in ("s3", "s3a"):
        options = _s3_options(options, policy or RetryPolicy())
    try:
        fs, path = fsspec.core.url_to_fs(url, **options)
    except ImportError as exc:
        raise SourceError(f"{missing_package(protocol) or exc} (reading {redact(url, options)})") from exc
    if protocol in ("s3", "s3a"):
        fs.retries = 1  # s3fs's own loop: one attempt (ours retries, and counts)
    return fs, path


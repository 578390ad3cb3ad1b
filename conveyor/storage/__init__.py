"""Object storage access for nodes: fsspec with our retry policy, error kinds, secret redaction.

Every remote read a node makes goes through a ``Storage``: it resolves a URL to an fsspec
filesystem (any protocol; S3 through s3fs), runs each request with a timeout, retries the
transient failures of object storage (HTTP 500/503, SlowDown and other throttling, reset or
dropped connections, timeouts) with capped exponential backoff and jitter, counts what it did
(``stats``), and turns the permanent failures into conveyor errors that name the URL at once:

* no such bucket, access denied, bad or no credentials: ``SourceError`` (the whole source is
  unusable);
* no such object, a corrupt or other permanent failure of one object: ``SampleError``;
* a transient failure that outlived its attempts: ``SampleError`` saying how many were made,
  but ``SourceError`` when the server could not be reached at all (connection refused, a name
  that does not resolve): that is about the server, not one object, and is never skipped.

s3fs and botocore retry on their own; for filesystems made here both are turned down to a
single attempt (s3fs ``retries``, botocore ``total_max_attempts``) so that the policy is ours
and every retry is counted. Socket timeouts come from ``RetryPolicy.timeout`` unless the spec's
``storage_options.config_kwargs`` sets them. Async filesystems (s3fs, gcsfs, http) run their
requests as coroutines on fsspec's IO loop, many at once without a thread each; synchronous
ones (local disk) on a small thread pool.

Secrets: ``storage_options`` are never logged, put in messages or in state. ``redact`` takes
any text and replaces the secret values it knows (from the options and the AWS environment
variables) and URL passwords with ``***``; every message built here goes through it.

An optional ``LocalCache`` keeps remote objects (or ranges) in a local folder, bounded in
bytes, least recently used evicted first, shared by several processes (file locks), keyed by
each object's size and ETag as well as its URL: an object replaced under its name is read anew.

This package's face is this module; its parts, bottom up: ``_errors`` (error kinds,
descriptions, redaction), ``_policy`` (retry policy, counters, sizes), ``_filesystems`` (URL to
fsspec filesystem, the options it takes), ``_cache``, ``_listing`` (``glob``), ``_readers``
(block and range readers) and ``_storage`` (``Storage``, ``read_url``).

Example:
    >>> st = Storage(policy=RetryPolicy(attempts=3, timeout=10))
    >>> data = st.read("examples/data/numbers/a/1.txt")            # doctest: +SKIP
    >>> st.stats.as_dict()["retries"]                               # doctest: +SKIP
    0
"""

from conveyor.storage._cache import LocalCache
from conveyor.storage._errors import (DENIED, NO_BUCKET, NOT_FOUND, PERMANENT, TRANSIENT, classify, describe,
                                      no_connection, no_credentials, redact, secret_values)
from conveyor.storage._filesystems import (filesystem, is_local, known_options, missing_package, protocol_of,
                                           unknown_options)
from conveyor.storage._listing import fixed_part, is_folder_marker, single_slashes
from conveyor.storage._policy import RetryPolicy, StorageStats, parse_size
from conveyor.storage._storage import Storage, read_url, version_of

__all__ = [
    "DENIED",
    "LocalCache",
    "NOT_FOUND",
    "NO_BUCKET",
    "PERMANENT",
    "RetryPolicy",
    "Storage",
    "StorageStats",
    "TRANSIENT",
    "classify",
    "describe",
    "filesystem",
    "fixed_part",
    "is_folder_marker",
    "is_local",
    "known_options",
    "no_connection",
    "no_credentials",
    "parse_size",
    "missing_package",
    "protocol_of",
    "read_url",
    "redact",
    "secret_values",
    "single_slashes",
    "unknown_options",
    "version_of",
]

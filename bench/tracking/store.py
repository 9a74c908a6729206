"""The MLflow store behind a tracking URI: HTTP timeouts and retries, the start-up check of the URI, where a
sqlite store keeps its artifacts."""

from __future__ import annotations

import os
import re
import sqlite3
import time
import urllib.parse
import urllib.request
from pathlib import Path

from bench.core.errors import BenchError, InputError, clip_words
from bench.core.paths import check_not_system, resolve_path

#: MLflow HTTP settings the harness uses unless the variable is already set: timeout per request (s),
#: retries, backoff factor (s) and jitter (s). Worst case per failing call: about 10 + 2 x 10 + 3 s.
HTTP_DEFAULTS = {"MLFLOW_HTTP_REQUEST_TIMEOUT": "10", "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
                 "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1", "MLFLOW_HTTP_REQUEST_BACKOFF_JITTER": "0.5"}
#: seconds the start-up reachability probe of an ``http(s)://`` tracking server may take, both of its requests
#: (``/health``, then :data:`API_PROBE`) together
PROBE_TIMEOUT_S = 5.0
#: an MLflow REST call the probe makes after ``/health`` (a read: the default experiment, by name)
API_PROBE = "/api/2.0/mlflow/experiments/get-by-name?experiment_name=Default"
#: what the library calls the tracking store's URI in its messages (:class:`bench.core.errors.InputError`); the
#: commands print their flag in its place (``--tracking-uri``)
TRACKING_URI = "tracking URI"
#: URI schemes a tracking URI may use (MLflow 3 no longer opens a ``file:`` store: refused with a hint)
SCHEMES = ("sqlite", "http", "https", "postgresql", "mysql", "mssql", "databricks")
#: database schemes -> the Python modules SQLAlchemy may use as their driver (one must be importable)
DB_DRIVERS = {"postgresql": ("psycopg2", "psycopg", "pg8000"), "mysql": ("pymysql", "MySQLdb", "mysql.connector"),
              "mssql": ("pyodbc", "pymssql")}
#: what a tracking URI may be, for messages
ALLOWED_URIS = "sqlite:///PATH, http(s)://HOST:PORT or a database URL (postgresql://, mysql://, mssql://)"


def http_defaults() -> None:
    """Set :data:`HTTP_DEFAULTS` in ``os.environ`` where the user has not set them (MLflow reads them per call)."""
    for key, value in HTTP_DEFAULTS.items():
        os.environ.setdefault(key, value)


def sqlite_path(uri: str) -> Path | None:
    """The database file of ``sqlite[+driver]:///PATH`` (``None`` for another URL or another form)."""
    scheme, sep, rest = uri.partition("://")
    if sep and scheme.partition("+")[0] == "sqlite" and rest.startswith("/"):
        return Path(urllib.parse.unquote(rest[1:].split("?", 1)[0]))
    return None


def discard_half_made(db: Path) -> None:
    """Remove a SQLite store this process began to create and could not finish (a full disk): the file, its
    rollback journal and the harness's creation lock; a rerun creates it afresh."""
    for leftover in (db, Path(f"{db}-journal"), Path(f"{db}.lock")):
        leftover.unlink(missing_ok=True)


#: an outage of the tracking store in our words: (pattern over the texts of the exception and its causes, lower
#: case, -> what the store did); the first that matches wins (:func:`outage_reason`)
_OUTAGES = (
    (r"connection refused|failed to establish a new connection|newconnectionerror", "refused the connection"),
    (r"too many (\d{3}) error responses|error code (\d{3}) != 200|status code (\d{3})", "answered HTTP {code}"),
    (r"timed out|timeout", "did not answer within {timeout} s"),
    (r"remotedisconnected|connection aborted|connection reset|broken pipe|closed connection",
     "closed the connection"),
    (r"name resolution|name or service not known|nodename nor servname|getaddrinfo", "has a host name that does "
     "not resolve"),
    (r"sslerror|ssl:|certificate verify", "failed the TLS handshake"),
    (r"database is locked", "stayed locked by another process"),
    (r"unable to open database file|readonly database|read-only", "cannot be written"),
    (r"file is not a database|database disk image is malformed|no such table|no such column|"
     r"can't locate revision|not an mlflow database", "is not a usable MLflow database (corrupted, "
     "truncated or replaced)"),
    (r"database or disk is full|disk i/o error|no space left on device", "could not write (disk full or an I/O "
     "error)"),
)
#: lines of a library's error text that are never ours to print: SQLAlchemy's statement, its parameters and its
#: help link
_LIBRARY_LINES = re.compile(r"^\s*(\(|\[sql:|\[parameters:|\(background on this error|from |where |values )",
                            re.IGNORECASE)


def outage_reason(exc: BaseException, uri: str, limit: int = 200, named: bool = True) -> str:
    """One line, in our words, saying why the tracking store at ``uri`` stopped taking uploads (the queued line and
    the warning show it): what the store did (refused the connection, no answer within the HTTP timeout, an HTTP
    status, a database file that is no longer an MLflow database, ...) read from ``exc`` and the exceptions it
    wraps, never the library's text (SQLAlchemy's ``[SQL: ...]`` statement and parameters are never shown); an
    error of another kind gives its type and first line, at most ``limit`` characters, cut between words
    (:func:`bench.core.errors.clip_words`). ``named=False``: without the leading "the tracking store URI" (for a
    message that names the URI already)."""
    texts, seen, cur = [], 0, exc
    while cur is not None and seen < 10:
        texts.append(f"{type(cur).__name__} {cur}")
        cur = cur.__cause__ or cur.__context__
        seen += 1
    low = " ".join(texts).lower()
    scheme, sep, rest = uri.partition("://")
    host, slash, path = rest.partition("/")
    shown = f"{scheme}{sep}{host.rpartition('@')[2]}{slash}{path}" if sep else uri  # never a password
    where = " ".join(filter(None, ("the tracking", "server" if scheme.lower() in ("http", "https") else "store",
                                   shown)))
    for pattern, what in _OUTAGES:
        m = re.search(pattern, low)
        if m:
            code = next((g for g in m.groups() if g), "")
            t = re.search(r"(?:read|connect) timeout=([\d.]+)", low)
            timeout = t.group(1) if t else os.environ.get("MLFLOW_HTTP_REQUEST_TIMEOUT", HTTP_DEFAULTS[
                "MLFLOW_HTTP_REQUEST_TIMEOUT"])
            try:
                timeout = f"{float(timeout):g}"
            except ValueError:
                pass
            what = what.format(code=code, timeout=timeout)
            return f"{where} {what}" if named else what
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip() and not _LIBRARY_LINES.match(ln)]
    return clip_words(f"{type(exc).__name__}: {lines[0]}", limit) if lines else type(exc).__name__


def _uri_error(text: str) -> InputError:
    """The error ``"tracking URI <text>"`` (``text``: the URI, then ``: <what is wrong>``)."""
    return InputError(TRACKING_URI, f"{TRACKING_URI} {text}")


def store_failure(exc: BaseException, uri: str) -> str:
    """Why a call to the MLflow store at ``uri`` failed, in one line of our words, for a warning that names the
    store already ("report not logged to MLflow at URI: <this>"): a :class:`BenchError`'s own message, else
    :func:`outage_reason` without the store's name (never SQLAlchemy's statement or MLflow's text)."""
    if isinstance(exc, BenchError):
        return str(exc)
    return outage_reason(exc, uri, named=False)


def _lower_scheme(uri: str, what: str) -> None:
    """Refuse a URL whose scheme is not in lower case (``SQLITE:///x.db``: SQLAlchemy and MLflow know no such
    dialect)."""
    scheme = uri.split("://", 1)[0] if "://" in uri else ""
    if scheme != scheme.lower():
        raise InputError(what, f"{what} {uri}: write the scheme in lower case ({scheme.lower()}://...)")


def in_memory(uri: str) -> bool:
    """Whether a database URL names a store that keeps nothing after the process ends (an in-memory sqlite
    database: ``sqlite://``, ``sqlite:///:memory:``, ``?mode=memory``, ``file::memory:``)."""
    low = uri.strip().lower()
    if not low.startswith("sqlite"):
        return False
    rest = low.split(":", 1)[1] if ":" in low else ""
    path = rest.removeprefix("//").removeprefix("/").split("?", 1)[0]
    return path in ("", ":memory:", "file::memory:") or "mode=memory" in low or ":memory:" in path


def check_tracking_uri(uri: str, probe: bool = True) -> None:
    """Check a tracking URI without writing anything: known scheme; a store that persists (no in-memory
    database); a sqlite file that is a database (or absent, in a writable folder); with ``probe``, an
    ``http(s)`` server that answers within :data:`PROBE_TIMEOUT_S`.

    Raises:
        InputError: naming the tracking URI (:data:`TRACKING_URI`) and what is wrong.
    """
    if not isinstance(uri, str) or not uri.strip() or "\x00" in uri:
        raise _uri_error(f"{uri!r}: empty or not a URI (allowed: {ALLOWED_URIS})")
    if in_memory(uri):
        raise _uri_error(f"{uri}: an in-memory database keeps nothing after this process (runs "
                         "would be lost); use sqlite:///PATH or a tracking server")
    scheme = uri.split(":", 1)[0].lower() if ":" in uri else ""
    _lower_scheme(uri, TRACKING_URI)
    if uri.strip() == "databricks" or scheme == "databricks":  # MLflow's word for a Databricks workspace
        if probe:
            check_databricks(uri)
        return
    if scheme == "file" or (scheme == "" and uri.strip()):
        raise _uri_error(f"{uri}: MLflow {_mlflow_version()} keeps no file store (a folder of runs); "
                         f"use sqlite:///PATH (allowed: {ALLOWED_URIS})")
    if scheme.split("+", 1)[0] not in SCHEMES:
        raise _uri_error(f"{uri}: unsupported scheme (allowed: {ALLOWED_URIS})")
    check_database(uri, TRACKING_URI, "mlflow")
    if scheme in ("http", "https"):
        parsed = urllib.parse.urlparse(uri)
        if not parsed.hostname:
            raise _uri_error(f"{uri}: no host")
        try:
            parsed.port  # noqa: B018 - raises on a bad port
        except ValueError:
            raise _uri_error(f"{uri}: bad port") from None
        if not probe:
            return
        deadline = time.monotonic() + PROBE_TIMEOUT_S
        for path, what in (("/health", "unreachable"), (API_PROBE, "answers /health but not the MLflow API")):
            left = deadline - time.monotonic()
            try:
                if left <= 0:
                    raise TimeoutError("timed out")
                with urllib.request.urlopen(uri.rstrip("/") + path, timeout=left) as resp:
                    resp.read(64)
            except urllib.error.HTTPError as exc:  # it answered: a server without /health is still a server,
                # but an API path unknown to it (404 without MLflow's JSON error) is not MLflow's
                if path == API_PROBE and exc.code == 404 and b"error_code" not in (exc.read(4096) or b""):
                    raise _uri_error(f"{uri}: the server answers /health but not the MLflow API "
                                     f"(HTTP 404 at {API_PROBE}); give the URL of an MLflow tracking server") from None
            except (OSError, ValueError) as exc:
                why = getattr(exc, "reason", None) or exc
                raise _uri_error(f"{uri}: tracking server {what} within {PROBE_TIMEOUT_S:g} s "
                                 f"({why}); start it (or wait until it serves), or use a sqlite:/// store and "
                                 "`run_bench.py sync` later") from None


def check_databricks(uri: str) -> None:
    """A ``databricks`` (or ``databricks://PROFILE``) tracking URI needs a configured workspace, as MLflow reads it:
    ``DATABRICKS_HOST`` in the environment or a ``~/.databrickscfg`` profile file (nothing is contacted).

    Raises:
        BenchError: neither is there.
    """
    if os.environ.get("DATABRICKS_HOST") or (Path.home() / ".databrickscfg").is_file():
        return
    raise _uri_error(f"{uri}: a Databricks workspace, but none is configured (set DATABRICKS_HOST and "
                     "DATABRICKS_TOKEN, or write a profile to ~/.databrickscfg); or use sqlite:///PATH")


#: what :func:`sqlite_kind` tells apart, in the words of the messages
STORE_KINDS = {"mlflow": "an MLflow tracking store", "optuna": "an Optuna storage"}


def sqlite_kind(db: Path) -> str | None:
    """What the existing SQLite file ``db`` holds, read without writing (``mode=ro``, 2 s busy timeout):
    ``"mlflow"`` (tables ``experiments`` and ``runs``), else ``"optuna"`` (``studies`` and ``version_info``),
    ``"other: t1, t2, ..."`` (other tables, none of them ``alembic_version``), ``"damaged: <sqlite's words>"``
    (not a database or malformed), or ``None`` (no tables, a store still being created by its migrations, or it
    cannot be read now: locked, a WAL file without its index; the store's own opening then decides)."""
    try:
        con = sqlite3.connect(db.resolve().as_uri() + "?mode=ro", uri=True, timeout=2)
    except sqlite3.Error:
        return None
    try:
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    except sqlite3.DatabaseError as exc:
        words = str(exc)
        if "malformed" in words or "not a database" in words:
            return f"damaged: {words}"
        return None
    finally:
        con.close()
    if {"experiments", "runs"} <= tables:  # first: an MLflow store an Optuna storage was once pointed at is both
        return "mlflow"
    if {"studies", "version_info"} <= tables:
        return "optuna"
    if "alembic_version" in tables:  # a store another harness is creating right now (migrations under way)
        return None
    user = sorted(t for t in tables if not t.startswith("sqlite_"))
    return f"other: {', '.join(user[:5])}{', ...' if len(user) > 5 else ''}" if user else None


def _check_kind(label: str, uri: str, db: Path, want: str) -> None:
    kind = sqlite_kind(db)
    if kind is None or kind == want:
        return
    use = ("sqlite:///<results>/mlflow.db, the default" if want == "mlflow"
           else "sqlite:///<results>/optuna.db, the default")
    if kind.startswith("damaged: "):
        raise InputError(label, f"{label} {uri}: {db} is damaged ({kind.removeprefix('damaged: ')}); restore it from a "
                         f"copy, or give a new file ({use})")
    what = STORE_KINDS.get(kind) or f"a SQLite database of something else (tables {kind.removeprefix('other: ')})"
    raise InputError(label, f"{label} {uri}: {db} is {what}, not {STORE_KINDS[want]}; give another file ({use})")


def check_database(uri: str, label: str, want: str | None = None) -> None:
    """The database part of a store URL, checked without writing anything: for ``sqlite:///PATH`` a file that is a
    SQLite database (or absent, in a writable folder) with names of legal length and, with ``want`` ("mlflow" or
    "optuna"), one that holds that kind of store or nothing yet (:func:`sqlite_kind`); for a database server URL
    (``postgresql``, ``mysql``, ``mssql``, with an optional ``+driver``) an installed driver. Other URLs pass.

    Raises:
        InputError: starting with ``label`` (what the caller calls the URL: :data:`TRACKING_URI`, a matrix key),
            the URL and what is wrong (the other kind of store, a damaged file).
    """
    _lower_scheme(uri, label)
    scheme = uri.split(":", 1)[0].lower() if ":" in uri else ""
    dialect, _, driver = scheme.partition("+")
    if dialect in DB_DRIVERS:
        wanted = (driver,) if driver else DB_DRIVERS[dialect]
        if not any(_importable(m) for m in wanted):
            raise InputError(label, f"{label} {uri}: no {dialect} driver installed (pip install one of: "
                             f"{', '.join(wanted)}), or use sqlite:///PATH")
    db = sqlite_path(uri)
    if dialect == "sqlite" and db is None:
        raise InputError(label, f"{label} {uri}: a sqlite URI is sqlite:///PATH (three slashes)")
    if db is not None:
        if uri.split("?", 1)[0].endswith("/"):
            raise InputError(label, f"{label} {uri}: names a folder (allowed: sqlite:///PATH to a database file, e.g. "
                             f"sqlite:///{str(db).rstrip('/') or 'results'}/mlflow.db)")
        resolve_path(label, db, uri)  # names within limits, no dangling link (MLflow retried one for 100 s)
        if not db.exists() or db.is_file():  # a device or folder there is named below as "not a file"
            check_not_system(label, db, "file")
        folder = db.parent
        while not folder.exists() and folder.parent != folder:
            folder = folder.parent
        if db.exists():
            if not db.is_file():
                raise InputError(label, f"{label} {uri}: {db} is not a file")
            try:
                with open(db, "rb") as fh:
                    head = fh.read(16)
            except OSError as exc:
                raise InputError(label, f"{label} {uri}: cannot read {db}: {exc.strerror}") from None
            if head and head != b"SQLite format 3\x00":
                raise InputError(label, f"{label} {uri}: {db} is not a SQLite database")
            if not os.access(db, os.W_OK) or not os.access(db.parent, os.W_OK | os.X_OK):
                raise InputError(label, f"{label} {uri}: {db} is not writable")
            if head and want is not None:
                _check_kind(label, uri, db, want)
        elif not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK):
            raise InputError(label, f"{label} {uri}: folder {folder} is not writable")


def _importable(module: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _mlflow_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("mlflow")
    except PackageNotFoundError:
        return "(not installed)"


def _artifact_location(tracking_uri: str, experiment: str) -> str | None:
    """For a ``sqlite:///path/db`` store, artifacts go beside the database (``path/mlartifacts/<exp>``)
    instead of MLflow's default under the current folder; ``None`` (server default) otherwise."""
    if tracking_uri.startswith("sqlite:///"):
        db = Path(tracking_uri[len("sqlite:///"):])
        return (db.resolve().parent / "mlartifacts" / experiment).as_uri()
    return None

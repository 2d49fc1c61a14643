"""Why an open or a read failed, in words an operator can act on.

FFmpeg reports a camera that accepts the connection and never answers as ``InvalidDataError`` with an errno
like 1094995529, an unknown host as ``EIO``, and OpenCV reports nothing but False. :func:`explain` turns what
PyAV raised into one plain reason; :func:`diagnose` finds the reason where the backend gave none (OpenCV) by
looking at the file or trying a TCP connection to the camera. Reasons name the host and port, taken from the
parsed URL, or the file; never the URL's credentials.
"""

from __future__ import annotations

import errno
import os
import re
import socket
import stat
import threading
from urllib.parse import urlsplit

from streamd.config.streams import is_live_url
from streamd.ingest.sources.base import scrub

_DEFAULT_PORTS = {"rtsp": 554, "rtsps": 322}
_ERRNO_PREFIX = re.compile(r"\[Errno -?\d+\] ")
_HTTP_STATUS = {
    "HTTPUnauthorizedError": "authentication failed (401 Unauthorized): check the user name and password "
    "in the URL",
    "HTTPForbiddenError": "access denied (403 Forbidden): this user may not open this stream",
    "HTTPNotFoundError": "stream not found (404 Not Found): check the path in the URL",
    "HTTPBadRequestError": "the camera rejected the request (400 Bad Request)",
    "HTTPTooManyRequestsError": "the camera refuses more sessions (429 Too Many Requests)",
    "HTTPOtherClientError": "the camera refused the request (a 4xx answer)",
    "HTTPServerError": "the camera answered with a server error (5xx): it may be overloaded or rebooting",
}


def endpoint(url: str) -> str:
    """``host:port`` of a live URL (the scheme's default port when none is given), without credentials."""
    try:
        parts = urlsplit(url)
        host, port = parts.hostname or "?", parts.port or _DEFAULT_PORTS.get(parts.scheme.lower(), 554)
    except ValueError:
        return "?"
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def open_timeout(url: str, timeout_s: float) -> str:
    """The reason for an open that ran into ``open_timeout_s``."""
    if is_live_url(url):
        return f"no answer from the camera at {endpoint(url)} within {timeout_s:g} s (open_timeout_s)"
    return f"the file gave no data within {timeout_s:g} s (open_timeout_s)"


def read_timeout(waited_s: float, timeout_s: float, key: str) -> str:
    """The reason for a read that ran into its timeout; ``waited_s`` is how long nothing came."""
    return f"no answer for {waited_s:.1f} s ({key} {timeout_s:g} s)"


def file_problem(path: str) -> str | None:
    """What keeps ``path`` from being opened at all (missing, a folder, unreadable, empty); None if nothing.
    Nothing is read: a FIFO or a device is left as it is."""
    try:
        st = os.stat(path)
        if stat.S_ISDIR(st.st_mode):
            return "is a folder, not a video file"
        if stat.S_ISREG(st.st_mode):
            with open(path, "rb"):
                pass
        elif not os.access(path, os.R_OK):
            raise PermissionError
    except FileNotFoundError:
        return "no such file"
    except PermissionError:
        return f"permission denied: the user running streamd (uid {os.geteuid()}) cannot read it"
    except OSError as exc:
        return f"cannot read it: {exc.strerror or exc}"
    return "the file is empty (0 bytes)" if stat.S_ISREG(st.st_mode) and st.st_size == 0 else None


def explain(exc: BaseException, url: str, *, reading: bool = False) -> str:
    """The reason for a failed open (``reading`` False) or read, from the exception PyAV (FFmpeg) raised."""
    name = type(exc).__name__
    code = getattr(exc, "errno", None)
    live = is_live_url(url)
    if reading and name in ("InvalidDataError", "EOFError"):
        if live:
            return f"{endpoint(url)} closed the connection or sent data FFmpeg cannot parse"
        return "damaged or cut-off data in the file (FFmpeg cannot parse it)"
    if not live:
        problem = file_problem(url)
        if problem:
            return problem
        if name == "InvalidDataError":
            return "not a video file (FFmpeg recognises no container format in it)"
        if name == "EOFError":
            return "the file ends before its first video packet"
    elif name in _HTTP_STATUS:
        return _HTTP_STATUS[name]
    elif code == errno.ECONNREFUSED:
        return (
            f"connection refused by {endpoint(url)}: nothing listens there (wrong port, or the camera's "
            "RTSP service is off)"
        )
    elif code == errno.ECONNRESET:
        return f"connection reset by {endpoint(url)}"
    elif code in (errno.EHOSTUNREACH, errno.ENETUNREACH):
        return f"{endpoint(url)} is unreachable ({os.strerror(code)}): check the address and the network"
    elif code == errno.ETIMEDOUT:
        return f"no answer from {endpoint(url)}: the connection attempt timed out"
    elif name in ("InvalidDataError", "EOFError"):
        return (
            f"{endpoint(url)} closed the connection without an RTSP answer (is this the camera's RTSP port?)"
        )
    elif code == errno.EIO:  # what FFmpeg's tcp protocol returns when the host name does not resolve
        host = urlsplit(url).hostname or ""
        if host and _resolves(host) is False:
            return f"host not found: {host!r} (the DNS lookup failed)"
    text = getattr(exc, "strerror", None) or str(exc) or name
    return scrub(_ERRNO_PREFIX.sub("", str(text)), url)


def diagnose(url: str, timeout_s: float) -> str:
    """The reason for a failed open where the backend gave none: the file looked at, or a TCP connection
    to the camera tried (at most ``timeout_s``)."""
    if not is_live_url(url):
        return file_problem(url) or "not a video file, or no video stream in it"
    where = endpoint(url)
    try:
        parts = urlsplit(url)
        host, port = parts.hostname or "", parts.port or _DEFAULT_PORTS.get(parts.scheme.lower(), 554)
    except ValueError:
        return "malformed URL"
    if _resolves(host, timeout_s) is False:
        return f"host not found: {host!r} (the DNS lookup failed)"
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as conn:
            if parts.scheme.lower() == "rtsp":  # rtsps would need TLS; the connection is what is known then
                return _describe_answer(conn, url, where)
    except ConnectionRefusedError:
        return (
            f"connection refused by {where}: nothing listens there (wrong port, or the camera's RTSP "
            "service is off)"
        )
    except TimeoutError:
        return f"no answer from {where} within {timeout_s:g} s"
    except OSError as exc:
        return f"cannot connect to {where}: {exc.strerror or exc}"
    return (
        f"{where} accepts connections but the stream did not open: wrong path or credentials, or not a "
        "video stream (the opencv backend does not say which; pyav does)"
    )


def _describe_answer(conn: socket.socket, url: str, where: str) -> str:
    """Ask the camera to DESCRIBE the stream (without credentials) and say what its answer means."""
    parts = urlsplit(url)
    target = parts._replace(netloc=where).geturl()  # no user:pass: a login-less answer tells enough
    try:
        conn.sendall(f"DESCRIBE {target} RTSP/1.0\r\nCSeq: 1\r\nAccept: application/sdp\r\n\r\n".encode())
        status = conn.recv(4096).split(b"\r\n", 1)[0].decode("latin-1")
    except TimeoutError:
        return f"{where} accepts connections but gives no RTSP answer (is this the camera's RTSP port?)"
    except OSError as exc:
        return f"{where} accepts connections, then: {exc.strerror or exc}"
    if not status:
        return f"{where} closed the connection without an RTSP answer (is this the camera's RTSP port?)"
    fields = status.split(" ", 2)
    if not fields[0].startswith("RTSP/") or len(fields) < 2:
        return f"{where} is not an RTSP server (it answered {status[:40]!r})"
    code = fields[1]
    if code == "401":
        login = "check the user name and password in the URL" if parts.username else "the URL has none"
        return f"the camera requires a login (401 Unauthorized): {login}"
    if code == "404":
        return _HTTP_STATUS["HTTPNotFoundError"]
    if code == "403":
        return _HTTP_STATUS["HTTPForbiddenError"]
    if code == "200":
        return "the camera describes the stream, but it did not open (no video, or a codec FFmpeg lacks)"
    return f"the camera answered {status.strip()[:60]!r}"


def _resolves(host: str, timeout_s: float = 2.0) -> bool | None:
    """Whether ``host`` resolves (None: the lookup took longer than ``timeout_s``)."""
    result: list[bool] = []

    def lookup() -> None:
        try:
            socket.getaddrinfo(host, None)
            result.append(True)
        except (socket.gaierror, UnicodeError):
            result.append(False)

    thread = threading.Thread(target=lookup, name="streamd-dns", daemon=True)  # getaddrinfo has no timeout
    thread.start()
    thread.join(timeout_s)
    return result[0] if result else None

"""A thin client over etcd's HTTP/JSON gateway (``etcd3gw``): the few calls placement needs, each bounded by a
timeout, each failure one ``EtcdError`` with a one-line reason.

Several endpoints: a request that cannot reach one tries the next (a member down is not the cluster down).
Keys and values are text; revisions and lease ids are ints. Only this module imports ``etcd3gw``.
"""

from __future__ import annotations

import base64
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit


class EtcdError(Exception):
    """etcd could not be reached or refused a request (the message is one line)."""


@dataclass(frozen=True)
class Entry:
    key: str
    value: str
    create_revision: int
    mod_revision: int
    lease: int  # 0: none


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _text(b64: str | None) -> str:
    return base64.b64decode(b64 or "").decode("utf-8", "replace")


def prefix_end(prefix: str) -> str:
    """The end of the key range holding every key that starts with ``prefix``."""
    raw = prefix.encode()
    return (raw[:-1] + bytes([raw[-1] + 1])).decode()


class Etcd:
    """The client. ``timeout_s`` bounds every request (connect and read)."""

    def __init__(self, endpoints: Sequence[str], timeout_s: float) -> None:
        try:
            import etcd3gw
        except ImportError as exc:
            raise EtcdError(
                "the etcd client is not installed: pip install 'streamd[cluster]' (etcd3gw)"
            ) from exc
        self.endpoints = tuple(endpoints)
        self.timeout_s = timeout_s
        self._clients = []
        for url in self.endpoints:
            parts = urlsplit(url)
            self._clients.append(
                etcd3gw.Etcd3Client(
                    host=parts.hostname or "localhost",
                    port=parts.port or 2379,
                    protocol=parts.scheme or "http",
                    timeout=timeout_s,
                    api_path="/v3/",  # etcd >= 3.4; no discovery round trip
                )
            )
        self._current = 0
        self._lock = threading.Lock()  # one requests.Session per endpoint, shared by the threads that call

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        from etcd3gw import exceptions

        last = ""
        with self._lock:
            for attempt in range(len(self._clients)):
                k = (self._current + attempt) % len(self._clients)
                client = self._clients[k]
                try:
                    result = client.post(client.get_url(path), json=body)
                except exceptions.ConnectionTimeoutError:
                    last = f"{self.endpoints[k]}: no answer within {self.timeout_s:g} s"
                    continue
                except exceptions.ConnectionFailedError as exc:
                    last = f"{self.endpoints[k]}: {_connect_error(exc)}"
                    continue
                except exceptions.Etcd3Exception as exc:
                    raise EtcdError(f"{self.endpoints[k]}: {path}: {_first_line(exc)}") from None
                except Exception as exc:  # the HTTP layer's own errors: never let one escape as a traceback
                    last = f"{self.endpoints[k]}: {type(exc).__name__}: {_first_line(exc)}"
                    continue
                self._current = k
                return dict(result)
        raise EtcdError(f"cannot reach etcd ({last})")

    # -- leases ----------------------------------------------------------------------------------------------
    def grant(self, ttl_s: int) -> int:
        return int(self._post("/lease/grant", {"TTL": ttl_s, "ID": 0})["ID"])

    def keepalive(self, lease: int) -> int:
        """Seconds left on the renewed lease; -1 when it has expired (its keys are gone)."""
        result = self._post("/lease/keepalive", {"ID": lease}).get("result", {})
        return int(result.get("TTL", -1))

    def time_to_live(self, lease: int) -> tuple[int, int]:
        """(seconds left, TTL granted); left is -1 once expired."""
        result = self._post("/kv/lease/timetolive", {"ID": lease})
        return int(result.get("TTL", -1)), int(result.get("grantedTTL", 0))

    def revoke(self, lease: int) -> None:
        self._post("/kv/lease/revoke", {"ID": lease})

    def revoke_if_alive(self, lease: int) -> None:
        """Revoke a lease that may have expired already (then etcd says it is not found: fine)."""
        try:
            self.revoke(lease)
        except EtcdError as exc:
            if "not found" not in str(exc):
                raise

    # -- keys ------------------------------------------------------------------------------------------------
    def get(self, key: str) -> Entry | None:
        entries, _ = self.range(key, None)
        return entries[0] if entries else None

    def range(self, key: str, end: str | None) -> tuple[list[Entry], int]:
        """Entries from ``key`` up to ``end`` (None: the one key), and the revision they were read at."""
        body: dict[str, Any] = {"key": _b64(key)}
        if end is not None:
            body["range_end"] = _b64(end)
        result = self._post("/kv/range", body)
        return [_entry(kv) for kv in result.get("kvs", [])], int(result.get("header", {}).get("revision", 0))

    def prefix(self, prefix: str) -> tuple[list[Entry], int]:
        return self.range(prefix, prefix_end(prefix))

    def put(self, key: str, value: str, lease: int = 0) -> None:
        body: dict[str, Any] = {"key": _b64(key), "value": _b64(value)}
        if lease:
            body["lease"] = lease
        self._post("/kv/put", body)

    def create(self, key: str, value: str, lease: int) -> int:
        """Put ``key`` only if absent, attached to ``lease``: its create revision (0: it existed)."""
        body = {
            "compare": [{"key": _b64(key), "result": "EQUAL", "target": "CREATE", "create_revision": 0}],
            "success": [{"request_put": {"key": _b64(key), "value": _b64(value), "lease": lease}}],
            "failure": [],
        }
        result = self._post("/kv/txn", body)
        if not result.get("succeeded"):
            return 0
        return int(result.get("header", {}).get("revision", 0))

    def delete_if(self, key: str, create_revision: int) -> bool:
        """Delete ``key`` if it is still the one created at ``create_revision``."""
        body = {
            "compare": [
                {"key": _b64(key), "result": "EQUAL", "target": "CREATE", "create_revision": create_revision}
            ],
            "success": [{"request_delete_range": {"key": _b64(key)}}],
            "failure": [],
        }
        return bool(self._post("/kv/txn", body).get("succeeded"))

    def put_if(self, puts: dict[str, str], held: dict[str, int]) -> bool:
        """Put every key of ``puts`` in one transaction, only while each key of ``held`` still has the given
        create revision (ownership keys: a node that lost a stream never overwrites its successor's state)."""
        body = {
            "compare": [
                {"key": _b64(k), "result": "EQUAL", "target": "CREATE", "create_revision": rev}
                for k, rev in held.items()
            ],
            "success": [{"request_put": {"key": _b64(k), "value": _b64(v)}} for k, v in puts.items()],
            "failure": [],
        }
        return bool(self._post("/kv/txn", body).get("succeeded"))

    def close(self) -> None:
        for client in self._clients:
            client.session.close()


def _entry(kv: dict[str, Any]) -> Entry:
    return Entry(
        _text(kv.get("key")),
        _text(kv.get("value")),
        int(kv.get("create_revision", 0)),
        int(kv.get("mod_revision", 0)),
        int(kv.get("lease", 0)),
    )


def _first_line(exc: BaseException) -> str:
    text = str(getattr(exc, "detail_text", None) or exc).strip() or type(exc).__name__
    return text.splitlines()[0][:200]


def _connect_error(exc: BaseException) -> str:
    """requests' long connection error, as the few words that say what happened."""
    text = str(getattr(exc, "detail_text", None) or exc)
    for needle, words in (
        ("Connection refused", "connection refused"),
        ("Name or service not known", "unknown host name"),
        ("No route to host", "no route to host"),
        ("timed out", "connect timed out"),
    ):
        if needle in text:
            return words
    return "cannot connect"

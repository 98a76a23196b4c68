"""One HTTP call to a server, bounded: an overall deadline per call, a capped answer, and a
one-line `ServerError` for anything else (no server, an HTTP error, an answer that is not JSON).

urllib's `timeout` bounds each receive, not the call: a server that trickles one byte a second
never times out. Here a timer shuts the socket down when the call's deadline passes, whatever
it is waiting for (the status line, a header, the body), and the body is read in chunks up to
`max_answer_bytes`. Standard library only (http.client).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import threading
import time
import urllib.parse
from typing import Any

from ..errors import ServerError

DEFAULT_DEADLINE_S = 600.0  # a /generate of a long document on a slow server takes minutes
MAX_ANSWER_BYTES = 64 << 20  # /tokenize of a 10^6-token document is about 7 MiB of JSON
CHUNK_BYTES = 1 << 16
ERROR_DETAIL_BYTES = 300


class HttpServer:
    """A server at a base URL (http or https); each `call` is bounded by `deadline_s`."""

    def __init__(
        self,
        url: str,
        deadline_s: float = DEFAULT_DEADLINE_S,
        max_answer_bytes: int = MAX_ANSWER_BYTES,
    ):
        self.url = url.rstrip("/")
        parts = urllib.parse.urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ServerError(f"{url!r} is not a server URL (http://host:port)")
        try:
            self._port = parts.port
        except ValueError:
            raise ServerError(f"{url!r} is not a server URL (http://host:port)") from None
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._base_path = parts.path
        self.deadline_s = float(deadline_s)
        self.max_answer_bytes = int(max_answer_bytes)

    def call(self, path: str, body: dict | None = None) -> bytes:
        """The answer's body to a GET (no `body`) or a JSON POST; ServerError otherwise."""
        data = None if body is None else json.dumps(body).encode()
        started = time.monotonic()
        kind = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
        connection = kind(self._host, self._port, timeout=self.deadline_s)
        expired = threading.Event()
        opened: list[socket.socket] = []  # the response reads from it after the connection
        # has let go of it (HTTP/1.0, Connection: close), so it is kept here for the timer

        def expire() -> None:
            expired.set()
            for sock in opened:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

        timer = None
        try:
            connection.connect()  # bounded by the socket timeout, which is the deadline
            opened.append(connection.sock)
            remaining_s = self.deadline_s - (time.monotonic() - started)
            if remaining_s <= 0:
                expire()
            timer = threading.Timer(max(remaining_s, 0.0), expire)
            timer.daemon = True
            timer.start()
            connection.request(
                "GET" if data is None else "POST",
                self._base_path + path,
                body=data,
                headers={"Content-Type": "application/json"},
            )
            response = connection.getresponse()
            if response.status >= 400:
                detail = response.read(ERROR_DETAIL_BYTES).decode(errors="replace")
                raise ServerError(f"{self.url}{path}: HTTP {response.status}: {detail}")
            return self._body(response, path, expired)
        except ServerError:
            raise
        except (OSError, http.client.HTTPException) as error:
            if expired.is_set():
                raise self._late(path) from None
            raise ServerError(f"no SGLang server at {self.url} ({error})") from None
        finally:
            if timer is not None:
                timer.cancel()
            connection.close()

    def _body(self, response, path: str, expired: threading.Event) -> bytes:
        chunks, size = [], 0
        while True:
            chunk = response.read(min(CHUNK_BYTES, self.max_answer_bytes + 1 - size))
            if expired.is_set():
                raise self._late(path)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
            size += len(chunk)
            if size > self.max_answer_bytes:
                raise ServerError(
                    f"{self.url}{path}: the answer is larger than {self.max_answer_bytes} bytes"
                )

    def _late(self, path: str) -> ServerError:
        return ServerError(f"{self.url}{path}: no complete answer within {self.deadline_s:g} s")

    def call_json(self, path: str, body: dict | None = None) -> Any:
        """The answer as JSON (an empty body: {}); ServerError when it is not JSON."""
        text = self.call(path, body)
        if not text:
            return {}
        try:
            return json.loads(text)
        except (ValueError, RecursionError):
            raise ServerError(f"{self.url}{path}: the answer is not JSON") from None

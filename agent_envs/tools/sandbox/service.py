"""The client of the sandbox service (`agent-envs serve-sandbox`, `agent_envs.server.sandbox`).

The service runs the same local workers; this backend only carries code there and the
`SandboxResult` back, over keep-alive HTTP connections to 127.0.0.1 (one per calling thread). The
limits and the preamble are the service's: a call's timeout is capped at the service's. A service
that is down, busy or stopping is an error result naming the URL and the reason, never an
exception, so the model reads a tool failure.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.parse
from typing import Any

from . import REPLY_GRACE_S, Sandbox, SandboxConfig, SandboxResult

RESULT_FIELDS = set(SandboxResult.__dataclass_fields__)
IDLE_CLOSE_S = 30.0  # a kept-alive connection idle this long is replaced before use


class ServiceSandbox(Sandbox):
    """Calls a sandbox service at `config.service_url` (e.g. "http://127.0.0.1:8100")."""

    def __init__(self, config: SandboxConfig) -> None:
        super().__init__(config)
        url = urllib.parse.urlsplit(self.config.service_url)
        if url.scheme != "http" or not url.hostname:
            raise ValueError(
                f"SandboxConfig.service_url must look like http://127.0.0.1:8100, got {self.config.service_url!r}"
            )
        self._host, self._port = url.hostname, url.port or 80
        self._local = threading.local()
        self._connections: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()

    def _connection(self, timeout: float) -> http.client.HTTPConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = http.client.HTTPConnection(self._host, self._port, timeout=timeout)
            self._local.conn = conn
            with self._lock:
                self._connections.append(conn)
        elif time.monotonic() - self._local.last_used > IDLE_CLOSE_S:
            # The service may be closing it right now (aiohttp closes idle ones after 75 s): a
            # request lost that way could not be told from one lost in a crash, and is not resent.
            conn.close()
        conn.timeout = timeout
        if conn.sock is not None:
            conn.sock.settimeout(timeout)
        return conn

    def _post(self, path: str, body: bytes, timeout: float) -> tuple[int, bytes]:
        conn = self._connection(timeout)
        try:
            conn.request("POST", path, body, {"Content-Type": "application/json"})
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            self._local.last_used = time.monotonic()

    def execute(self, code: str, timeout_s: float | None = None) -> SandboxResult:
        timeout = float(timeout_s if timeout_s is not None else self.config.timeout_s)
        body = json.dumps({"code": code, "timeout_s": timeout}).encode()
        where = f"the sandbox service at {self.config.service_url}"
        try:
            # The service lets a call wait for a worker at most its own timeout, then runs it.
            wait_s = 2 * timeout + REPLY_GRACE_S + 5.0
            status, data = self._post("/execute", body, wait_s)
        except TimeoutError:
            self._drop_connection()
            return SandboxResult(exit_code=None, error=f"{where} did not answer within {wait_s:g} s")
        except (OSError, http.client.HTTPException) as exc:
            self._drop_connection()
            return SandboxResult(exit_code=None, error=f"{where} is unreachable: {type(exc).__name__}: {exc}")
        try:
            reply: dict[str, Any] = json.loads(data)
        except (json.JSONDecodeError, UnicodeDecodeError):
            reply = {"error": data[:200].decode("utf-8", "replace")}
        if status != 200 or not set(reply) <= RESULT_FIELDS or "stdout" not in reply:
            return SandboxResult(exit_code=None, error=f"{where} answered {status}: {reply.get('error', reply)}")
        return SandboxResult(**reply)

    def _drop_connection(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()

    def health(self, timeout: float = 5.0) -> dict[str, Any]:
        """The service's `/health` answer (raises OSError when it is down)."""
        conn = http.client.HTTPConnection(self._host, self._port, timeout=timeout)
        try:
            conn.request("GET", "/health")
            return json.loads(conn.getresponse().read())
        finally:
            conn.close()

    @property
    def isolation(self) -> dict[str, Any]:
        try:
            return self.health()["isolation"]
        except (OSError, ValueError, KeyError):
            return {}

    def close(self) -> None:
        """Close the connections (the service and its workers keep running)."""
        with self._lock:
            connections, self._connections = self._connections, []
        for conn in connections:
            conn.close()
        self._local = threading.local()


__all__ = ["ServiceSandbox"]

"""Synchronous and asyncio clients for warren's REST v1 API."""

from __future__ import annotations

import asyncio
import base64
import functools
import json
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Callable, Dict, Iterator, List, Optional

DEFAULT_ADDR = "http://127.0.0.1:7443"
DEFAULT_DATA_DIR = "/var/lib/warren"


class WarrenError(Exception):
    """A classified error from the API: switch on ``code``, never on the message."""

    def __init__(self, status: int, code: str, message: str, retry_after: float = 0.0):
        super().__init__(f"{message} ({code})")
        self.status = status
        self.code = code
        self.message = message
        self.retry_after = retry_after

    @property
    def retryable(self) -> bool:
        return self.status in (429, 503)


@dataclass
class ExecResult:
    exit_code: int
    timed_out: bool
    stdout: bytes
    stderr: bytes
    signal: str = ""
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    stdout_bytes: int = 0
    stderr_bytes: int = 0
    duration_ms: int = 0
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, d: Dict[str, Any], stdout: Optional[bytes] = None, stderr: Optional[bytes] = None) -> "ExecResult":
        return cls(
            exit_code=d.get("exit_code", 0),
            timed_out=d.get("timed_out", False),
            stdout=stdout if stdout is not None else _decode(d.get("stdout", ""), d.get("stdout_encoding", "")),
            stderr=stderr if stderr is not None else _decode(d.get("stderr", ""), d.get("stderr_encoding", "")),
            signal=d.get("signal", ""),
            stdout_truncated=d.get("stdout_truncated", False),
            stderr_truncated=d.get("stderr_truncated", False),
            stdout_bytes=d.get("stdout_bytes", 0),
            stderr_bytes=d.get("stderr_bytes", 0),
            duration_ms=d.get("duration_ms", 0),
            raw=d,
        )


def _decode(data: str, encoding: str) -> bytes:
    return base64.b64decode(data) if encoding == "base64" else data.encode()


def _default_token() -> str:
    tok = os.environ.get("WARREN_TOKEN", "")
    if tok:
        return tok
    path = os.path.join(os.environ.get("WARREN_DATA_DIR", DEFAULT_DATA_DIR), "admin-token")
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


class Client:
    """A synchronous client. Safe to share between threads."""

    def __init__(self, addr: Optional[str] = None, token: Optional[str] = None, timeout: float = 600.0,
                 create_retries: int = 3):
        addr = addr or os.environ.get("WARREN_ADDR") or DEFAULT_ADDR
        if "://" not in addr:
            addr = "http://" + addr
        self.addr = addr.rstrip("/")
        self.token = token if token is not None else _default_token()
        self.timeout = timeout
        self.create_retries = create_retries

    # -- plumbing ---------------------------------------------------------

    def _request(self, method: str, path: str, query: Optional[Dict[str, Any]] = None, body: Any = None,
                 content_type: str = "application/json", accept: str = "application/json"):
        url = self.addr + path
        if query:
            url += "?" + urllib.parse.urlencode(query, doseq=True)
        data = None
        if body is not None:
            data = json.dumps(body).encode() if content_type == "application/json" else body
        req = urllib.request.Request(url, data=data, method=method)
        req.add_header("Authorization", "Bearer " + self.token)
        req.add_header("Accept", accept)
        req.add_header("User-Agent", "warren-python")
        if data is not None:
            req.add_header("Content-Type", content_type)
        try:
            return urllib.request.urlopen(req, timeout=self.timeout)
        except urllib.error.HTTPError as e:
            raise _error_from(e) from None

    def _json(self, method: str, path: str, **kw) -> Any:
        with self._request(method, path, **kw) as resp:
            raw = resp.read()
        return json.loads(raw) if raw else None

    # -- sandboxes --------------------------------------------------------

    @staticmethod
    def _create_body(image: str, backend: str, cpu: float, memory: Any, pids: int, ttl: Any, idle_timeout: Any,
                     labels: Optional[Dict[str, str]], env: Optional[Dict[str, str]], extra: Dict[str, Any]):
        body: Dict[str, Any] = {"image": image}
        if backend:
            body["backend"] = backend
        res = {k: v for k, v in (("cpu", cpu), ("memory", memory), ("pids", pids)) if v}
        if res:
            body["resources"] = res
        for k, v in (("ttl", ttl), ("idle_timeout", idle_timeout), ("labels", labels), ("env", env)):
            if v:
                body[k] = v
        body.update(extra)
        return body

    def _retrying(self, path: str, body: Dict[str, Any]) -> Any:
        for attempt in range(self.create_retries + 1):
            try:
                return self._json("POST", path, body=body)
            except WarrenError as e:
                if not e.retryable or attempt == self.create_retries:
                    raise
                time.sleep(e.retry_after or 1.0)
        raise AssertionError("unreachable")

    def create_sandbox(self, image: str, *, backend: str = "", cpu: float = 0, memory: Any = 0, pids: int = 0,
                       ttl: Any = None, idle_timeout: Any = None, labels: Optional[Dict[str, str]] = None,
                       env: Optional[Dict[str, str]] = None, **extra: Any) -> Dict[str, Any]:
        """Create and start a sandbox. Retries 429/503 refusals after their Retry-After.

        extra goes into the request as is: project="research/rl-math",
        idempotency_key="rollout-17" (replays return the same sandbox), layers=[...].
        """
        body = self._create_body(image, backend, cpu, memory, pids, ttl, idle_timeout, labels, env, extra)
        return self._retrying("/v1/sandboxes", body)

    def create_sandboxes(self, count: int, image: str, *, all_or_none: bool = True, **template: Any) -> Dict[str, Any]:
        """Create a gang of count sandboxes from one template (GRPO-style group).

        With all_or_none (the default) either all are created or none, and a
        refusal is retried after its Retry-After; without it, the answer lists
        the created members under "sandboxes" and the failures under "errors".
        """
        kw = {k: template.pop(k, d) for k, d in (("backend", ""), ("cpu", 0), ("memory", 0), ("pids", 0),
                                                ("ttl", None), ("idle_timeout", None), ("labels", None), ("env", None))}
        body = {"count": count, "template": self._create_body(image, extra=template, **kw), "all_or_none": all_or_none}
        if all_or_none:
            return self._retrying("/v1/sandboxes:batch", body)
        return self._json("POST", "/v1/sandboxes:batch", body=body)

    def get_sandbox(self, sid: str) -> Dict[str, Any]:
        return self._json("GET", "/v1/sandboxes/" + sid)

    def list_sandboxes(self, labels: Optional[Dict[str, str]] = None, state: str = "") -> List[Dict[str, Any]]:
        q: Dict[str, Any] = {}
        if labels:
            q["label"] = [f"{k}={v}" for k, v in labels.items()]
        if state:
            q["state"] = state
        return self._json("GET", "/v1/sandboxes", query=q)["sandboxes"]

    def delete_sandbox(self, sid: str) -> None:
        """Destroy a sandbox. Idempotent."""
        self._request("DELETE", "/v1/sandboxes/" + sid).close()

    # -- exec -------------------------------------------------------------

    @staticmethod
    def _exec_body(argv, cmd, env, cwd, user, stdin, timeout, max_output) -> Dict[str, Any]:
        if (argv is None) == (cmd is None):
            raise ValueError("give exactly one of argv and cmd")
        body: Dict[str, Any] = {"argv": list(argv)} if argv is not None else {"cmd": cmd}
        for k, v in (("env", env), ("cwd", cwd), ("user", user), ("timeout", timeout), ("max_output", max_output)):
            if v:
                body[k] = v
        if stdin is not None:
            raw = stdin.encode() if isinstance(stdin, str) else bytes(stdin)
            try:
                body["stdin"] = raw.decode()
            except UnicodeDecodeError:
                body["stdin"], body["stdin_encoding"] = base64.b64encode(raw).decode(), "base64"
        return body

    def exec(self, sid: str, argv: Optional[List[str]] = None, *, cmd: Optional[str] = None,
             env: Optional[Dict[str, str]] = None, cwd: str = "", user: str = "", stdin: Any = None,
             timeout: Any = None, max_output: Any = None) -> ExecResult:
        """Run a command and wait for it: stdout and stderr come back as bytes."""
        body = self._exec_body(argv, cmd, env, cwd, user, stdin, timeout, max_output)
        return ExecResult.from_json(self._json("POST", f"/v1/sandboxes/{sid}/exec", body=body))

    def exec_stream(self, sid: str, argv: Optional[List[str]] = None, *, cmd: Optional[str] = None,
                    on_stdout: Optional[Callable[[bytes], None]] = None,
                    on_stderr: Optional[Callable[[bytes], None]] = None, **kw: Any) -> ExecResult:
        """Run a command, calling on_stdout/on_stderr with each chunk as it arrives."""
        body = self._exec_body(argv, cmd, kw.get("env"), kw.get("cwd", ""), kw.get("user", ""), kw.get("stdin"),
                               kw.get("timeout"), kw.get("max_output"))
        body["stream"] = True
        out, err = bytearray(), bytearray()
        with self._request("POST", f"/v1/sandboxes/{sid}/exec", body=body, accept="application/x-ndjson") as resp:
            for ev in _ndjson(resp):
                if "error" in ev:
                    e = ev["error"]
                    raise WarrenError(0, e.get("code", ""), e.get("message", ""))
                if "result" in ev:
                    return ExecResult.from_json(ev["result"], bytes(out), bytes(err))
                data = _decode(ev.get("data", ""), ev.get("encoding", ""))
                if ev.get("stream") == "stdout":
                    out += data
                    if on_stdout:
                        on_stdout(data)
                elif ev.get("stream") == "stderr":
                    err += data
                    if on_stderr:
                        on_stderr(data)
        raise WarrenError(0, "internal", "exec stream ended without a result")

    # -- files ------------------------------------------------------------

    def write_file(self, sid: str, path: str, data: bytes, mode: int = 0o644) -> None:
        q = {"path": path, "mode": format(mode, "04o")}
        self._request("PUT", f"/v1/sandboxes/{sid}/files", query=q, body=data,
                      content_type="application/octet-stream").close()

    def read_file(self, sid: str, path: str) -> bytes:
        with self._request("GET", f"/v1/sandboxes/{sid}/files", query={"path": path},
                           accept="application/octet-stream") as resp:
            return resp.read()

    def write_tar(self, sid: str, dir: str, tar: bytes) -> None:
        self._request("PUT", f"/v1/sandboxes/{sid}/files", query={"path": dir}, body=tar,
                      content_type="application/x-tar").close()

    def read_tar(self, sid: str, path: str) -> bytes:
        with self._request("GET", f"/v1/sandboxes/{sid}/files", query={"path": path, "format": "tar"},
                           accept="application/x-tar") as resp:
            return resp.read()

    def stat(self, sid: str, path: str) -> Dict[str, Any]:
        return self._json("GET", f"/v1/sandboxes/{sid}/stat", query={"path": path})

    # -- images, nodes ----------------------------------------------------

    def list_images(self) -> List[Dict[str, Any]]:
        return self._json("GET", "/v1/images")["images"]

    def list_nodes(self) -> List[Dict[str, Any]]:
        return self._json("GET", "/v1/nodes")["nodes"]


def _ndjson(resp: BinaryIO) -> Iterator[Dict[str, Any]]:
    for line in resp:
        line = line.strip()
        if line:
            yield json.loads(line)


def _error_from(e: urllib.error.HTTPError) -> WarrenError:
    body = e.read()
    code, message, retry = "", body.decode(errors="replace").strip() or e.reason, 0.0
    try:
        err = json.loads(body)["error"]
        code, message, retry = err.get("code", ""), err.get("message", message), float(err.get("retry_after", 0))
    except (ValueError, KeyError, TypeError):
        pass
    if not retry and e.headers.get("Retry-After", "").isdigit():
        retry = float(e.headers["Retry-After"])
    return WarrenError(e.code, code or f"http_{e.code}", message, retry)


class AsyncClient:
    """The same calls as Client, as coroutines run in worker threads."""

    def __init__(self, *args: Any, **kw: Any):
        self._sync = Client(*args, **kw)

    def __getattr__(self, name: str):
        fn = getattr(self._sync, name)
        if not callable(fn):
            return fn

        @functools.wraps(fn)
        async def call(*args: Any, **kw: Any):
            return await asyncio.to_thread(fn, *args, **kw)

        return call

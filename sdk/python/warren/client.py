"""Synchronous and asyncio clients for warren's REST v1 API."""

from __future__ import annotations

import asyncio
import base64
import functools
import json
import os
import posixpath
import socket
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Callable, Dict, Iterator, List, Optional, Union

DEFAULT_ADDR = "http://127.0.0.1:7443"
DEFAULT_DATA_DIR = "/var/lib/warren"


class WarrenError(Exception):
    """A classified error from the API: switch on ``code``, never on the message.

    Each HTTP class of refusal raises a subclass (ForbiddenError,
    ConflictError, ...), so ``except ConflictError`` and
    ``except WarrenError`` both work; ``code`` tells the cases of a class
    apart (quota_exceeded or rate_limited within ExhaustedError).
    """

    def __init__(self, status: int, code: str, message: str, retry_after: float = 0.0, infra: str = ""):
        super().__init__(f"{message} ({code})")
        self.status = status
        self.code = code
        self.message = message
        self.retry_after = retry_after
        #: why the platform, not the task, made the call fail ("" if it did not)
        self.infra = infra

    @property
    def retryable(self) -> bool:
        return self.status in (429, 503)


class InvalidError(WarrenError):
    """400: a malformed request (invalid_argument, invalid_project, request_exceeds_quota)."""


class UnauthenticatedError(WarrenError):
    """401: the token is missing, unknown, expired or revoked (unauthenticated)."""


class ForbiddenError(WarrenError):
    """403: the token's role or scope does not reach the call (forbidden)."""


class NotFoundError(WarrenError):
    """404: sandbox_not_found, image_not_found, project_not_found, token_not_found, ..."""


class ConflictError(WarrenError):
    """409: project_exists, quota_exceeds_parent, quota_below_children, project_in_use, ..."""


class ExhaustedError(WarrenError):
    """429: quota_exceeded, rate_limited or node_full; try again after ``retry_after`` seconds."""


class UnavailableError(WarrenError):
    """503: no node or backend can take the request now (unavailable, sandbox_lost, ...)."""


class InternalError(WarrenError):
    """500: the server failed (internal)."""


class PortUnreachableError(WarrenError):
    """502 port_unreachable: nothing in the sandbox accepted a connection on that port."""


_STATUS_ERRORS = {400: InvalidError, 401: UnauthenticatedError, 403: ForbiddenError, 404: NotFoundError,
                  409: ConflictError, 429: ExhaustedError, 500: InternalError, 503: UnavailableError}

# The status each code is sent with, to classify an error event inside a
# 200 stream; codes ending in _not_found are 404.
_CODE_STATUS = {
    **dict.fromkeys(("invalid_argument", "invalid_project", "request_exceeds_quota"), 400),
    "unauthenticated": 401,
    "forbidden": 403,
    **dict.fromkeys(("conflict", "layer_exists", "env_exists", "layer_in_use", "project_exists",
                     "project_has_children", "project_in_use", "too_many_projects", "quota_exceeds_parent",
                     "quota_below_children", "idempotency_key_reused", "idempotency_claim_lost", "sandbox_not_running",
                     "sandbox_gone"), 409),
    **dict.fromkeys(("resource_exhausted", "node_full", "quota_exceeded", "rate_limited"), 429),
    "internal": 500,
    **dict.fromkeys(("unavailable", "backend_unavailable", "runtime_unavailable", "sandbox_lost", "node_unreachable"), 503),
    "port_unreachable": 502,
}


class InfraError(WarrenError):
    """The call failed because of the platform, not the task: its node was
    lost, its agent restarted mid-call, the platform shut the sandbox down,
    an internal error. ``infra`` says why. A trainer masks such a rollout
    instead of scoring it zero. Raised as a subclass of the status's own
    class too, so ``except UnavailableError`` still catches a lost node."""


_INFRA_CLASSES: Dict[type, type] = {}


def _error(status: int, code: str, message: str, retry_after: float = 0.0, infra: str = "") -> WarrenError:
    """The WarrenError subclass of status or, for an error inside a stream
    (status 0), of code; with infra, one that is an InfraError too."""
    cls = PortUnreachableError if code == "port_unreachable" else _STATUS_ERRORS.get(status)
    if cls is None and not status:
        cls = _STATUS_ERRORS.get(404 if code.endswith("_not_found") else _CODE_STATUS.get(code, 0))
    cls = cls or WarrenError
    if infra:
        if cls not in _INFRA_CLASSES:
            _INFRA_CLASSES[cls] = type("Infra" + cls.__name__, (InfraError, cls), {})
        cls = _INFRA_CLASSES[cls]
    return cls(status, code, message, retry_after, infra)


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


# PORT_RESPONSE_HEADER marks the answers a sandbox's own server gave
# through /ports: an answer without it is warren's (api.PortResponseHeader).
PORT_RESPONSE_HEADER = "X-Warren-Port-Response"


@dataclass
class PortResponse:
    """An answer of a server inside a sandbox (Client.port_request)."""
    status: int
    headers: Dict[str, str]
    body: bytes


class TLSError(WarrenError):
    """The TLS handshake refused the server: its certificate is not signed
    by a CA this client trusts (give ca= or WARREN_CA), or is not valid for
    the name dialed. Nothing reached the server. ``code`` is
    ``tls_untrusted``, ``tls_wrong_name`` or ``tls_failed``."""


def _tls_error(addr: str, err: ssl.SSLError) -> TLSError:
    msg = getattr(err, "verify_message", "") or str(err)
    if isinstance(err, ssl.SSLCertVerificationError) and getattr(err, "verify_code", 0) == 62:
        code, hint = "tls_wrong_name", "the server's certificate is not valid for the name dialed"
    elif isinstance(err, ssl.SSLCertVerificationError):
        code, hint = "tls_untrusted", ("the server's certificate is not signed by a CA this client trusts: "
                                       "give the cluster's CA (Client(ca=...) or WARREN_CA)")
    else:
        code, hint = "tls_failed", "TLS handshake failed"
    return TLSError(0, code, "TLS to %s: %s: %s" % (addr, hint, msg))


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
                 create_retries: int = 3, ca: Optional[str] = None):
        """addr defaults to WARREN_ADDR, token to WARREN_TOKEN (or the local
        admin-token file); ca is the CA file (PEM) that signed an https
        server's certificate (default WARREN_CA; none: the system's roots)."""
        addr = addr or os.environ.get("WARREN_ADDR") or DEFAULT_ADDR
        if "://" not in addr:
            addr = "http://" + addr
        self.addr = addr.rstrip("/")
        self.ca = ca if ca is not None else os.environ.get("WARREN_CA", "")
        self._ssl = None
        if self.addr.startswith("https://"):
            self._ssl = ssl.create_default_context(cafile=self.ca or None)
            self._ssl.minimum_version = ssl.TLSVersion.TLSv1_2
        self.token = token if token is not None else _default_token()
        self.timeout = timeout
        self.create_retries = create_retries
        self.fn = Fn(self)

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
            return urllib.request.urlopen(req, timeout=self.timeout, context=self._ssl)
        except urllib.error.HTTPError as e:
            raise _error_from(e) from None
        except urllib.error.URLError as e:
            if isinstance(e.reason, ssl.SSLError):
                raise _tls_error(self.addr, e.reason) from None
            raise

    def _json(self, method: str, path: str, **kw) -> Any:
        with self._request(method, path, **kw) as resp:
            raw = resp.read()
        return json.loads(raw) if raw else None

    # -- sandboxes --------------------------------------------------------

    @staticmethod
    def _create_body(image: str, backend: str, cpu: float, memory: Any, pids: int, ttl: Any, idle_timeout: Any,
                     labels: Optional[Dict[str, str]], env: Optional[Dict[str, str]], extra: Dict[str, Any],
                     node_selector: Optional[Dict[str, str]] = None, pool: str = "", runtime: str = "",
                     qos: str = ""):
        body: Dict[str, Any] = {"image": image}
        if backend:
            body["backend"] = backend
        if runtime:
            body["runtime"] = runtime
        if qos:
            body["qos"] = qos
        res = {k: v for k, v in (("cpu", cpu), ("memory", memory), ("pids", pids)) if v}
        if res:
            body["resources"] = res
        for k, v in (("ttl", ttl), ("idle_timeout", idle_timeout), ("labels", labels), ("env", env),
                     ("node_selector", node_selector), ("pool", pool)):
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
                       env: Optional[Dict[str, str]] = None, node_selector: Optional[Dict[str, str]] = None,
                       pool: str = "", runtime: str = "", qos: str = "", **extra: Any) -> Dict[str, Any]:
        """Create and start a sandbox. Retries 429/503 refusals after their Retry-After.

        network={"allow": ["pypi.org", "*.pythonhosted.org", "198.51.100.0/24:443"]}
        lets out only what it names (domains through the node's DNS proxy);
        network={"mode": "open"} the public internet; the default is none
        (loopback only). update_network changes it later.

        node_selector={"rack": "r1"} places it only on nodes with every one of
        those labels (warren agent --label), pool="cloud" only in that node
        pool; when no node matches, the answer is 503 no_matching_node.
        runtime="gvisor" runs a container sandbox under gVisor, a kernel in
        user space (stronger isolation; no network, so network must stay
        none; memory and pids limits hold for the whole sandbox); only nodes
        that run gVisor take it, else 503 runtime_unavailable says why.
        The default, runtime="" or "runc", is the host's kernel.
        qos="best-effort" makes it yield the CPU to latency work (every
        process under SCHED_IDLE, exec'd ones too) and be paused or evicted
        first under memory pressure; the default is "latency".
        extra goes into the request as is: project="research/rl-math",
        idempotency_key="rollout-17" (replays return the same sandbox), layers=[...].
        """
        body = self._create_body(image, backend, cpu, memory, pids, ttl, idle_timeout, labels, env, extra,
                                 node_selector, pool, runtime, qos)
        return self._retrying("/v1/sandboxes", body)

    def create_sandboxes(self, count: int, image: str, *, all_or_none: bool = True, **template: Any) -> Dict[str, Any]:
        """Create a gang of count sandboxes from one template (GRPO-style group).

        With all_or_none (the default) either all are created or none, and a
        refusal is retried after its Retry-After; without it, the answer lists
        the created members under "sandboxes" and the failures under "errors".
        """
        kw = {k: template.pop(k, d) for k, d in (("backend", ""), ("cpu", 0), ("memory", 0), ("pids", 0),
                                                ("ttl", None), ("idle_timeout", None), ("labels", None), ("env", None),
                                                ("node_selector", None), ("pool", ""), ("runtime", ""), ("qos", ""))}
        body = {"count": count, "template": self._create_body(image, extra=template, **kw), "all_or_none": all_or_none}
        if all_or_none:
            return self._retrying("/v1/sandboxes:batch", body)
        return self._json("POST", "/v1/sandboxes:batch", body=body)

    def get_sandbox(self, sid: str) -> Dict[str, Any]:
        return self._json("GET", "/v1/sandboxes/" + sid)

    def list_sandboxes(self, labels: Optional[Dict[str, str]] = None, state: str = "",
                       project: str = "") -> List[Dict[str, Any]]:
        """The sandboxes the token may see; project keeps those of that project's subtree."""
        q: Dict[str, Any] = {}
        if labels:
            q["label"] = [f"{k}={v}" for k, v in labels.items()]
        if state:
            q["state"] = state
        if project:
            q["project"] = project
        return self._json("GET", "/v1/sandboxes", query=q)["sandboxes"]

    def delete_sandbox(self, sid: str) -> None:
        """Destroy a sandbox. Idempotent."""
        self._request("DELETE", "/v1/sandboxes/" + sid).close()

    # -- pause and resume -------------------------------------------------

    def pause(self, sid: str) -> Dict[str, Any]:
        """Pause a running sandbox: its processes frozen, its memory pushed
        out where the node can, its TTL and idle clocks stopped. Any later
        call on it resumes it first. Returns the sandbox ("pause" says what
        the pause did)."""
        return self._json("POST", "/v1/sandboxes/%s/pause" % urllib.parse.quote(sid, safe=""), body={})

    def resume(self, sid: str) -> Dict[str, Any]:
        """Resume a paused sandbox (a running one is left as it is)."""
        return self._json("POST", "/v1/sandboxes/%s/resume" % urllib.parse.quote(sid, safe=""), body={})

    def pause_sandboxes(self, labels: Optional[Dict[str, str]] = None, project: str = "") -> Dict[str, Any]:
        """Pause every running sandbox with these labels in project's subtree
        (at least one of the two), across nodes: {"sandboxes": [...],
        "nodes": {node: {"done": n, "failed": n}}}."""
        return self._json("POST", "/v1/sandboxes:pause", body=self._selector(labels, project))

    def resume_sandboxes(self, labels: Optional[Dict[str, str]] = None, project: str = "") -> Dict[str, Any]:
        """Resume every paused sandbox the selector matches (pause_sandboxes)."""
        return self._json("POST", "/v1/sandboxes:resume", body=self._selector(labels, project))

    @staticmethod
    def _selector(labels: Optional[Dict[str, str]], project: str) -> Dict[str, Any]:
        body: Dict[str, Any] = {}
        if labels:
            body["labels"] = dict(labels)
        if project:
            body["project"] = project
        return body

    def journal(self, sid: str, since: int = 0) -> Dict[str, Any]:
        """The calls on sandbox sid its node recorded after entry since,
        oldest first: {"entries": [{"seq", "time", "verb", "argv", "cmd",
        "exit_code", "error", "stdout_head", "stdout_tail", ...}],
        "dropped": n}."""
        path = "/v1/sandboxes/%s/journal" % urllib.parse.quote(sid, safe="")
        if since:
            path += "?since=%d" % since
        return self._json("GET", path)

    def update_sandbox(self, sid: str, *, ttl: Any = None, idle_timeout: Any = None, auto_pause: Any = None,
                       labels: Optional[Dict[str, Optional[str]]] = None) -> Dict[str, Any]:
        """Change a live sandbox: ttl (it ends that long from now; "2h" or
        seconds), idle_timeout, auto_pause (0 turns them off), labels
        (a None value removes the label)."""
        body: Dict[str, Any] = {}
        for k, v in (("ttl", ttl), ("idle_timeout", idle_timeout), ("auto_pause", auto_pause)):
            if v is not None:
                body[k] = v
        if labels:
            body["labels"] = dict(labels)
        return self._json("PATCH", "/v1/sandboxes/" + urllib.parse.quote(sid, safe=""), body=body)

    # -- exec -------------------------------------------------------------

    @staticmethod
    def _exec_body(argv, cmd, env, cwd, user, stdin, timeout, max_output) -> Dict[str, Any]:
        if (argv is None) == (cmd is None):
            raise ValueError("give exactly one of argv and cmd")
        if isinstance(argv, str):
            # exec(sid, "ls -la") means the shell command, never the argv
            # ["l", "s", " ", ...] that iterating the string would make.
            argv, cmd = None, argv
        if cmd is not None and not isinstance(cmd, str):
            raise TypeError("cmd must be a str (a shell command), not %s" % type(cmd).__name__)
        if argv is not None:
            if isinstance(argv, (bytes, bytearray)) or not all(isinstance(a, str) for a in argv):
                raise TypeError("argv must be a list of str (or a str, run by the shell)")
            argv = list(argv)
            if not argv:
                raise ValueError("argv is empty")
        body: Dict[str, Any] = {"argv": argv} if argv is not None else {"cmd": cmd}
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

    def exec(self, sid: str, argv: Union[List[str], str, None] = None, *, cmd: Optional[str] = None,
             env: Optional[Dict[str, str]] = None, cwd: str = "", user: str = "", stdin: Any = None,
             timeout: Any = None, max_output: Any = None) -> ExecResult:
        """Run a command and wait for it: stdout and stderr come back as bytes.

        argv is a list of str, run as is; a str is a shell command (as cmd=).
        """
        body = self._exec_body(argv, cmd, env, cwd, user, stdin, timeout, max_output)
        return ExecResult.from_json(self._json("POST", f"/v1/sandboxes/{sid}/exec", body=body))

    def exec_stream(self, sid: str, argv: Union[List[str], str, None] = None, *, cmd: Optional[str] = None,
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
                    raise _error(ev.get("status", 0), e.get("code", ""), e.get("message", ""), infra=e.get("infra_error", ""))
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
        raise _error(0, "internal", "exec stream ended without a result")

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

    def verify(self, sid: str, image: str, copy: List[str], argv: Union[List[str], str, None] = None, *,
               cmd: Optional[str] = None, keep: bool = False, **exec_kw: Any) -> "VerifyResult":
        """Check sandbox sid's work in a clean room: a new sandbox from image
        (the grader's binaries and users, never the agent's) gets copies of
        the absolute paths in copy, at the same paths, and runs the command
        (argv or cmd, as exec takes them). sid is only read. Symbolic links
        leading out of a copied tree and special files are left out and
        listed in .skipped. The verifier is deleted afterwards unless keep.
        """
        from .verify import VerifyResult, filter_tree
        if not copy or any(not p.startswith("/") for p in copy):
            raise ValueError("copy needs at least one absolute path")
        v = self.create_sandbox(image)
        res = VerifyResult(result=None, verifier=v["id"])
        try:
            for p in copy:
                p = posixpath.normpath(p)
                if self.stat(sid, p).get("is_dir"):
                    tar = filter_tree(self.read_tar(sid, p), p, lambda n, why: res.skipped.append(f"{n}: {why}"))
                    self.write_tar(v["id"], posixpath.dirname(p), tar)
                else:
                    mode = self.stat(sid, p).get("mode", 0o644) & 0o777 or 0o644
                    self.write_file(v["id"], p, self.read_file(sid, p), mode)
            res.result = self.exec(v["id"], argv, cmd=cmd, **exec_kw)
        finally:
            if not keep:
                self.delete_sandbox(v["id"])
        return res

    def update_network(self, sid: str, *, mode: Optional[str] = None, allow: Optional[List[str]] = None,
                       add: Optional[List[str]] = None, remove: Optional[List[str]] = None) -> Dict[str, Any]:
        """Change a running sandbox's egress policy (PATCH /v1/sandboxes/{id}/network).

        mode="none" takes the network away, mode="open" opens it, allow=[...]
        replaces the allowlist, add/remove edit it. In force within a second,
        also for connections already open. Returns the policy now in force
        with denied_connections and denied_queries.
        """
        body: Dict[str, Any] = {}
        if mode is not None:
            body["mode"] = mode
        if allow is not None:
            body["allow"] = list(allow)
        if add:
            body["add"] = list(add)
        if remove:
            body["remove"] = list(remove)
        return self._json("PATCH", f"/v1/sandboxes/{sid}/network", body=body)

    def stats(self, sid: str) -> Dict[str, Any]:
        """A running sandbox's resource use now: cpu_seconds, memory, memory_peak (bytes), pids."""
        return self._json("GET", f"/v1/sandboxes/{sid}/stats")

    # -- snapshots and forks -----------------------------------------------

    def snapshot(self, sid: str, name: str = "", version: str = "", *, strip: Optional[List[str]] = None,
                 labels: Optional[Dict[str, str]] = None, keep_residue: bool = False,
                 with_processes: bool = False) -> Dict[str, Any]:
        """Turn what running sandbox sid wrote into the environment
        name@version (default: the snapshot's id, the next version); the
        sandbox runs on. strip leaves paths out; build residue (shell
        histories, caches, /tmp) is left out unless keep_residue, and
        listed in the result's stats["residue"]. Returns the snapshot
        (its "ref" is the environment to create sandboxes from; "stats"
        has freeze_ms, how long the sandbox was held still)."""
        body: Dict[str, Any] = {}
        if name:
            body["name"] = name
        if version:
            body["version"] = version
        if strip:
            body["strip"] = list(strip)
        if labels:
            body["labels"] = dict(labels)
        if keep_residue:
            body["keep_residue"] = True
        if with_processes:
            body["with_processes"] = True
        return self._json("POST", "/v1/sandboxes/%s/snapshot" % urllib.parse.quote(sid, safe=""), body=body)

    def fork(self, sid: str, count: int = 1, *, labels: Optional[Dict[str, str]] = None,
             all_or_none: bool = True, with_processes: bool = False) -> List[Dict[str, Any]]:
        """Make count sandboxes from running sandbox sid's state now, each
        isolated from the others and from sid, which runs on. Returns the
        new sandboxes (with all_or_none=False, those made; the others'
        errors are logged in the answer fork_result() returns)."""
        return self.fork_result(sid, count, labels=labels, all_or_none=all_or_none,
                                with_processes=with_processes)["sandboxes"]

    def fork_result(self, sid: str, count: int = 1, *, labels: Optional[Dict[str, str]] = None,
                    all_or_none: bool = True, with_processes: bool = False) -> Dict[str, Any]:
        """fork's whole answer: "snapshot", "gang", "sandboxes", "errors"."""
        body: Dict[str, Any] = {"count": count, "all_or_none": all_or_none}
        if with_processes:
            body["with_processes"] = True
        if labels:
            body["labels"] = dict(labels)
        return self._json("POST", "/v1/sandboxes/%s/fork" % urllib.parse.quote(sid, safe=""), body=body)

    def list_snapshots(self, source: str = "") -> List[Dict[str, Any]]:
        """The snapshots in this token's scope, oldest first; source keeps
        those taken of that sandbox."""
        path = "/v1/snapshots"
        if source:
            path += "?" + urllib.parse.urlencode({"source": source})
        return self._json("GET", path)["snapshots"]

    def get_snapshot(self, ref: str) -> Dict[str, Any]:
        """A snapshot by id or by its environment's name@version."""
        return self._json("GET", "/v1/snapshots/" + urllib.parse.quote(ref, safe="@/"))

    def publish_environment(self, ref: str, check: str = "", timeout: Any = None) -> Dict[str, Any]:
        """Publish environment ref (a builder's snapshot) to runners; with
        check, only if that command passes (exit 0) in a fresh sandbox
        made from it, else a WarrenError with code "check_failed" (the
        outcome is on get_environment(ref)["check"])."""
        body: Dict[str, Any] = {}
        if check:
            body["check"] = check
        if timeout is not None:
            body["timeout"] = timeout
        return self._json("POST", "/v1/environments/" + urllib.parse.quote(ref, safe="@/") + "/publish", body=body)

    def squash_environment(self, ref: str) -> Dict[str, Any]:
        """Squash the diff layers on top of environment ref into one (a
        builder's call); returns {"environment": ..., "squashed": bool}."""
        return self._json("POST", "/v1/environments/" + urllib.parse.quote(ref, safe="@/") + "/squash", body={})

    def lineage(self, ref: str) -> Dict[str, Any]:
        """Where a snapshot (id or name@version) or a sandbox (id) comes
        from ("ancestors", "base") and the tree of what was made from it
        ("root": nodes with "snapshot" or "sandbox" and "children")."""
        return self._json("GET", "/v1/snapshots/" + urllib.parse.quote(ref, safe="@/") + "/lineage")

    def delete_snapshot(self, ref: str, force: bool = False) -> None:
        """Remove a snapshot with its environment; refused (409
        snapshot_in_use) while others build on it, unless force."""
        path = "/v1/snapshots/" + urllib.parse.quote(ref, safe="@/")
        if force:
            path += "?force=true"
        self._json("DELETE", path)

    # -- ports ------------------------------------------------------------

    def port_url(self, sid: str, port: int, path: str = "/") -> str:
        """The URL through the API of ``path`` (with its query) on ``port``
        inside sandbox ``sid``, whatever the sandbox's network (none too).
        Requests to it need this client's token (port_request sends it);
        the sandbox's server never sees the token."""
        if not path.startswith("/"):
            path = "/" + path
        return "%s/v1/sandboxes/%s/ports/%d%s" % (self.addr, urllib.parse.quote(sid, safe=""), port, path)

    def port_request(self, sid: str, port: int, path: str = "/", *, method: str = "GET",
                     body: Optional[bytes] = None, headers: Optional[Dict[str, str]] = None) -> "PortResponse":
        """Sends one HTTP request to the server on ``port`` inside sandbox
        ``sid`` and returns its answer, whatever its status. warren's own
        refusals raise WarrenError: NotFoundError for an unknown sandbox,
        InvalidError for a bad port, and code ``port_unreachable`` (502)
        when nothing listens there."""
        req = urllib.request.Request(self.port_url(sid, port, path), data=body, method=method)
        for k, v in (headers or {}).items():
            req.add_header(k, v)
        req.add_header("Authorization", "Bearer " + self.token)
        try:
            resp = urllib.request.urlopen(req, timeout=self.timeout, context=self._ssl)
        except urllib.error.HTTPError as e:
            if not e.headers.get(PORT_RESPONSE_HEADER):
                raise _error_from(e) from None
            resp = e
        except urllib.error.URLError as e:
            if isinstance(e.reason, ssl.SSLError):
                raise _tls_error(self.addr, e.reason) from None
            raise
        with resp:
            return PortResponse(resp.status, dict(resp.headers.items()), resp.read())

    def dial_port(self, sid: str, port: int) -> socket.socket:
        """Opens a tunnel to ``port`` inside sandbox ``sid`` (what
        ``warren port-forward`` does for each connection) and returns its
        socket: bytes sent go to 127.0.0.1:port inside the sandbox, bytes
        received come from it. ``sock.shutdown(socket.SHUT_WR)`` half-closes
        it over http (the server reads EOF and may still answer). Refusals
        raise WarrenError as port_request's do."""
        u = urllib.parse.urlsplit(self.addr)
        tls = u.scheme == "https"
        raw = socket.create_connection((u.hostname, u.port or (443 if tls else 80)), timeout=self.timeout)
        sock = raw
        try:
            if tls:
                ctx = ssl.create_default_context(cafile=self.ca or None)
                ctx.minimum_version = ssl.TLSVersion.TLSv1_2
                ctx.set_alpn_protocols(["http/1.1"])
                try:
                    sock = ctx.wrap_socket(raw, server_hostname=u.hostname)
                except ssl.SSLError as e:
                    raise _tls_error(self.addr, e) from None
            path = "%s/v1/sandboxes/%s/portforward/%d" % (u.path, urllib.parse.quote(sid, safe=""), port)
            sock.sendall(("GET %s HTTP/1.1\r\nHost: %s\r\nConnection: Upgrade\r\nUpgrade: tcp\r\n"
                          "Authorization: Bearer %s\r\nUser-Agent: warren-python\r\n\r\n"
                          % (path, u.netloc, self.token)).encode())
            head = b""
            while not head.endswith(b"\r\n\r\n"):  # a byte at a time: what follows is the tunnel's
                b = sock.recv(1)
                if not b:
                    raise _error(0, "internal", "the server closed the tunnel before answering")
                head += b
                if len(head) > 64 << 10:
                    raise _error(0, "internal", "the tunnel's answer has no end of headers")
            lines = head.decode("latin-1").split("\r\n")
            status = int(lines[0].split(" ")[1])
            if status == 101:
                sock.settimeout(None)
                return sock
            hdrs = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
            body = b""
            n = int(hdrs.get("content-length", "0") or 0)
            while len(body) < n:
                chunk = sock.recv(n - len(body))
                if not chunk:
                    break
                body += chunk
            raise _error_body(status, body, hdrs.get("retry-after", ""))
        except BaseException:
            sock.close()
            raise

    # -- images, nodes ----------------------------------------------------

    def list_images(self) -> List[Dict[str, Any]]:
        return self._json("GET", "/v1/images")["images"]

    def list_nodes(self) -> List[Dict[str, Any]]:
        return self._json("GET", "/v1/nodes")["nodes"]

    # -- projects and tokens ----------------------------------------------
    #
    # Projects form a tree ("research", "research/rl-math"; "" or "/" is the
    # root). A token acts on one project's subtree with a role: reader <
    # runner (+ sandboxes) < builder (+ layers, environments) < admin (+
    # sub-projects, tokens). A quota is a dict of the limits a subtree may
    # use: sandboxes, cpu (vCPU), memory and disk (bytes or "2Ti"),
    # creates_per_sec, creates_burst; a key left out or 0 sets no limit of
    # the project's own. Sub-project quotas are carved out of their parent's,
    # so an agent with an admin token can hand part of its quota on.

    def create_project(self, path: str, *, quota: Optional[Dict[str, Any]] = None,
                       description: str = "", memory_merge: bool = False) -> Dict[str, Any]:
        """Create a sub-project with a quota carved out of its parent's; returns the project.

        Needs an admin token scoped to a proper ancestor. Raises ConflictError
        (project_exists; quota_exceeds_parent when the parent has not that
        much left to hand down; too_many_projects), NotFoundError
        (project_not_found: no parent), ForbiddenError, InvalidError
        (invalid_project: a malformed path; invalid_argument: an unknown quota key).
        memory_merge lets nodes merge equal memory pages (KSM) among the
        project's sandboxes and its sub-projects', never with another
        project's: for one tenant's projects only.
        """
        body: Dict[str, Any] = {"path": path, "quota": dict(quota or {})}
        if description:
            body["description"] = description
        if memory_merge:
            body["memory_merge"] = True
        return self._json("POST", "/v1/projects", body=body)

    def get_project(self, path: str) -> Dict[str, Any]:
        """One project: its quota, its subtree's usage (and reserved), its direct children."""
        return self._json("GET", _project_path(path))

    def list_projects(self, path: str = "") -> List[Dict[str, Any]]:
        """The project at path and every one under it, parents first.

        An empty path lists the token's own project's subtree; "/" is the root.
        """
        return self._json("GET", "/v1/projects", query={"path": path} if path else None)["projects"]

    def update_project(self, path: str, *, quota: Optional[Dict[str, Any]] = None,
                       description: Optional[str] = None,
                       memory_merge: Optional[bool] = None) -> Dict[str, Any]:
        """Change the quota keys given (0 removes that limit), the description and/or memory merging; keep the rest.

        Needs an admin of a proper ancestor: a project cannot raise its own
        quota (ForbiddenError). Raises as create_project, and ConflictError
        quota_below_children when a limit would drop below what the project
        handed down. A quota may drop below current usage: creates then wait.
        """
        body: Dict[str, Any] = {}
        if quota is not None:
            body["quota"] = dict(quota)
        if description is not None:
            body["description"] = description
        if memory_merge is not None:
            body["memory_merge"] = memory_merge
        return self._json("PATCH", _project_path(path), body=body)

    def delete_project(self, path: str) -> None:
        """Delete a project without sub-projects or sandboxes; its tokens stop working.

        Raises ConflictError (project_has_children, project_in_use) otherwise.
        """
        if not path.strip("/"):
            raise ValueError("the root project cannot be deleted")
        self._request("DELETE", _project_path(path)).close()

    def create_token(self, role: str, *, project: str = "", ttl: Any = None, name: str = "",
                     description: str = "") -> Dict[str, Any]:
        """Mint a token: returns {"token": {...}, "secret": "wrn_..."}; the secret is shown this once.

        project is the token's scope (default the caller's own, "/" the root);
        ttl its lifetime ("720h" or seconds; default the caller's own expiry).
        The caller must be an admin whose scope holds project, and the token
        may neither outrank nor outlive it (ForbiddenError).
        """
        body: Dict[str, Any] = {"role": role}
        for k, v in (("project", project), ("ttl", ttl), ("name", name), ("description", description)):
            if v:
                body[k] = v
        return self._json("POST", "/v1/tokens", body=body)

    def list_tokens(self, project: str = "") -> List[Dict[str, Any]]:
        """The tokens scoped anywhere in project's subtree (default the caller's own), oldest first, no secrets.

        Needs an admin token.
        """
        return self._json("GET", "/v1/tokens", query={"project": project} if project else None)["tokens"]

    def revoke_token(self, token_id: str) -> None:
        """Revoke a token by its id: it stops working at once here, within seconds everywhere.

        An unknown id, or one outside the caller's scope, is NotFoundError (token_not_found).
        """
        if not token_id:
            raise ValueError("empty token id")
        self._request("DELETE", "/v1/tokens/" + urllib.parse.quote(token_id, safe="")).close()


def _project_path(path: str) -> str:
    """/v1/projects/{path} with each segment escaped; "" and "/" are the root."""
    return "/v1/projects/" + "/".join(urllib.parse.quote(seg, safe="") for seg in path.strip("/").split("/"))


def _ndjson(resp: BinaryIO) -> Iterator[Dict[str, Any]]:
    for line in resp:
        line = line.strip()
        if line:
            yield json.loads(line)


def _error_from(e: urllib.error.HTTPError) -> WarrenError:
    return _error_body(e.code, e.read(), e.headers.get("Retry-After", ""), e.reason)


def _error_body(status: int, body: bytes, retry_after: str = "", reason: str = "") -> WarrenError:
    code, message, retry, infra = "", body.decode(errors="replace").strip() or reason, 0.0, ""
    try:
        err = json.loads(body)["error"]
        code, message, retry = err.get("code", ""), err.get("message", message), float(err.get("retry_after", 0))
        infra = err.get("infra_error", "")
    except (ValueError, KeyError, TypeError):
        pass
    if not retry and retry_after.isdigit():
        retry = float(retry_after)
    return _error(status, code or f"http_{status}", message, retry, infra)


def _bytes_field(body: Dict[str, Any], key: str, data: Union[str, bytes, None]) -> None:
    """Sets body[key] (and key_encoding) from text or bytes, base64 if not UTF-8."""
    if data is None:
        return
    if isinstance(data, str):
        data = data.encode()
    try:
        body[key] = data.decode("utf-8")
    except UnicodeDecodeError:
        body[key] = base64.b64encode(data).decode()
        body[key + "_encoding"] = "base64"


class Fn:
    """FnCall: stateless judge, compile and test jobs, each in a fresh
    pre-created container of its runtime (``client.fn.run(...)``).

    A result is the API's FnResult as a dict: ``status`` (OK, WrongAnswer,
    NonZeroExit, TimeLimit, MemoryLimit, OutputLimit, Signal, CompileError,
    or SandboxError, which is never the program's fault), ``compile`` and
    ``cases``, each case with status, exit_code, signal, stdout, stderr
    (bytes here, decoded from the wire), cpu_ms, wall_ms and peak_memory.
    """

    def __init__(self, client: "Client"):
        self._c = client

    @staticmethod
    def request(runtime: str, source: Union[str, bytes] = "", *, files: Optional[Dict[str, Union[str, bytes]]] = None,
                stdin: Union[str, bytes, None] = None, cases: Optional[List[Any]] = None,
                args: Optional[List[str]] = None, env: Optional[Dict[str, str]] = None,
                limits: Optional[Dict[str, Any]] = None, stop_on_fail: bool = False,
                compare: str = "", project: str = "") -> Dict[str, Any]:
        """Builds a request body. ``cases`` are (stdin, expected) pairs or
        stdin values (expected None: not compared); ``limits`` uses the
        API's keys: cpu_time, wall_time ("2s"), memory ("256Mi"), pids,
        output, file_size; ``project`` is the project the call counts
        against (its fn_calls_per_sec; default the token's)."""
        body: Dict[str, Any] = {"runtime": runtime}
        if isinstance(source, bytes):
            try:
                source = source.decode("utf-8")
            except UnicodeDecodeError:
                raise ValueError("source must be UTF-8; pass binary programs in files") from None
        if source:
            body["source"] = source
        if files:
            body["files"] = []
            for path, content in files.items():
                f: Dict[str, Any] = {"path": path}
                _bytes_field(f, "content", content)
                if "content_encoding" in f:
                    f["encoding"] = f.pop("content_encoding")
                body["files"].append(f)
        _bytes_field(body, "stdin", stdin)
        if cases:
            body["cases"] = []
            for case in cases:
                inp, want = case if isinstance(case, (tuple, list)) else (case, None)
                c: Dict[str, Any] = {}
                _bytes_field(c, "stdin", inp)
                _bytes_field(c, "expected", want)
                body["cases"].append(c)
        for k, v in (("args", args), ("env", env), ("limits", limits), ("stop_on_fail", stop_on_fail),
                     ("compare", compare), ("project", project)):
            if v:
                body[k] = v
        return body

    @staticmethod
    def _decoded(res: Dict[str, Any]) -> Dict[str, Any]:
        for case in ([res["compile"]] if res.get("compile") else []) + res.get("cases", []):
            for stream in ("stdout", "stderr"):
                case[stream] = _decode(case.get(stream, ""), case.pop(stream + "_encoding", ""))
        return res

    def run(self, runtime: str, source: Union[str, bytes] = "", **kw: Any) -> Dict[str, Any]:
        """Runs one call (see request for the arguments). A 429 (every
        container busy) is retried like a create, then raised."""
        return self._decoded(self._c._retrying("/v1/fn/run", self.request(runtime, source, **kw)))

    def batch(self, calls: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
        """Runs independent calls (bodies from Fn.request) concurrently on
        the fleet. Returns one item per call, in order: {"result": ...} or
        {"error": {"code", "message"}}."""
        items = self._c._json("POST", "/v1/fn/batch", body={"calls": calls})["results"]
        for item in items:
            if item.get("result"):
                self._decoded(item["result"])
        return items

    def runtimes(self) -> List[Dict[str, Any]]:
        """The runtimes the fleet declares, with their pools."""
        return self._c._json("GET", "/v1/fn/runtimes")["runtimes"]


class _Async:
    """Wraps an object so that its methods become coroutines run in worker
    threads; attributes that are objects (client.fn) are wrapped alike."""

    def __init__(self, obj: Any):
        self._sync = obj

    def __getattr__(self, name: str):
        fn = getattr(self._sync, name)
        if isinstance(fn, Fn):
            return _Async(fn)
        if not callable(fn):
            return fn

        @functools.wraps(fn)
        async def call(*args: Any, **kw: Any):
            return await asyncio.to_thread(fn, *args, **kw)

        return call


class AsyncClient(_Async):
    """The same calls as Client, as coroutines run in worker threads."""

    def __init__(self, *args: Any, **kw: Any):
        super().__init__(Client(*args, **kw))

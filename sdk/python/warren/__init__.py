"""warren: Python SDK for the warren sandbox platform (REST v1).

Standard library only. ``Client`` is synchronous; ``AsyncClient`` offers the
same calls as coroutines (each runs in a worker thread, so thousands of
concurrent sandboxes don't need thousands of event-loop-blocking calls).

    from warren import Client
    c = Client()                       # WARREN_ADDR / WARREN_TOKEN, or the local `warren up`
    sb = c.create_sandbox(image="busybox", cpu=1, memory="256Mi", ttl="30m", labels={"task": "demo"})
    r = c.exec(sb["id"], cmd="echo hello; exit 3")
    assert r.exit_code == 3 and r.stdout == b"hello\\n"
    c.delete_sandbox(sb["id"])

Projects and tokens: an admin token hands part of its project's quota to a
sub-project and mints a token scoped to it.

    c.create_project("research/rl-math", quota={"sandboxes": 200, "cpu": 50, "memory": "200Gi"})
    secret = c.create_token("runner", project="research/rl-math", ttl="720h", name="trainer-7")["secret"]
    worker = Client(token=secret)      # creates count against research/rl-math's quota
    try:
        worker.create_sandbox("busybox")
    except ExhaustedError as e:        # e.code == "quota_exceeded" or "rate_limited"
        time.sleep(e.retry_after)

FnCall judges a program in a fresh container per call, once per test case:

    r = c.fn.run("python3", "print(sum(map(int, input().split())))",
                 cases=[("1 2\\n", "3"), ("2 2\\n", "5")], limits={"cpu_time": "2s", "memory": "256Mi"})
    [case["status"] for case in r["cases"]]   # ["OK", "WrongAnswer"]; SandboxError is never the program's

A server inside a sandbox is reached through the API whatever the
sandbox's network (none too): HTTP to one of its ports, or a raw tunnel:

    r = c.port_request(sb["id"], 8000, "/health")   # r.status, r.headers, r.body: the server's answer
    c.port_url(sb["id"], 8000, "/docs")             # the URL, for any HTTP client with the token
    s = c.dial_port(sb["id"], 5432)                 # a socket to 127.0.0.1:5432 inside

A verdict computed in the agent's own sandbox runs the agent's binaries;
``verify`` runs the check in a fresh sandbox of the grader's image holding
only copies of the named paths (links leading out of them left out):

    v = c.verify(sb["id"], "grader@1", ["/work"], cmd="cd /work && python3 -m pytest -q")
    v.result.exit_code, v.skipped

Over https, ``Client(ca="/etc/warren/pki/ca.crt")`` (or WARREN_CA) trusts the
cluster CA of `warren cert init`; a server it cannot verify raises TLSError.

Refusals raise WarrenError, as the subclass of their HTTP class:
InvalidError (400), UnauthenticatedError (401), ForbiddenError (403),
NotFoundError (404), ConflictError (409), ExhaustedError (429),
InternalError (500), PortUnreachableError (502), UnavailableError (503). Switch on ``e.code``
(quota_exceeded, project_exists, ...), never on the message.
"""

from .client import (AsyncClient, Client, ConflictError, ExecResult, ExhaustedError, Fn, ForbiddenError, InfraError,
                     InternalError, InvalidError, NotFoundError, PortResponse, PortUnreachableError, TLSError, UnauthenticatedError,
                     UnavailableError, WarrenError)
from .verify import VerifyResult

__all__ = ["Client", "AsyncClient", "ExecResult", "Fn", "WarrenError", "InvalidError", "UnauthenticatedError",
           "ForbiddenError", "NotFoundError", "ConflictError", "ExhaustedError", "InternalError", "UnavailableError", "TLSError", "InfraError",
           "PortResponse", "PortUnreachableError", "VerifyResult"]

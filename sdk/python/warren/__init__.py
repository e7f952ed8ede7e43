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
"""

from .client import AsyncClient, Client, ExecResult, WarrenError

__all__ = ["Client", "AsyncClient", "ExecResult", "WarrenError"]

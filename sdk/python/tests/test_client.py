"""Tests of the Python SDK against a live API (WARREN_ADDR, WARREN_TOKEN).

sdk/python/sdk_test.go starts an apiserver over the fake backend and runs
these; they also run against a real `warren up`.
"""

import asyncio
import io
import os
import sys
import tarfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from warren import AsyncClient, Client, InfraError, UnavailableError, WarrenError  # noqa: E402
from warren.client import _error_body  # noqa: E402


class ClientTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.c = Client()
        cls.sb = cls.c.create_sandbox("busybox", cpu=0.5, memory="128Mi", ttl="10m", labels={"suite": "python"})

    @classmethod
    def tearDownClass(cls):
        cls.c.delete_sandbox(cls.sb["id"])

    def test_exec(self):
        r = self.c.exec(self.sb["id"], cmd="echo hello; echo oops >&2; exit 3")
        self.assertEqual((r.stdout, r.stderr, r.exit_code, r.timed_out), (b"hello\n", b"oops\n", 3, False))

    def test_exec_string_runs_in_the_shell(self):
        # A str is a shell command, never iterated into ["e", "c", "h", "o", ...].
        r = self.c.exec(self.sb["id"], "echo a   b; exit 2")
        self.assertEqual((r.stdout, r.exit_code), (b"a b\n", 2))
        chunks = []
        r = self.c.exec_stream(self.sb["id"], "echo streamed", on_stdout=chunks.append)
        self.assertEqual((b"".join(chunks), r.exit_code), (b"streamed\n", 0))

        async def main():
            return await AsyncClient().exec(self.sb["id"], "echo from async; exit 5")

        r = asyncio.run(main())
        self.assertEqual((r.stdout, r.exit_code), (b"from async\n", 5))
        for bad in (b"ls -la", ["ls", 3], []):
            with self.assertRaises((TypeError, ValueError)):
                self.c.exec(self.sb["id"], bad)
        with self.assertRaises(ValueError):
            self.c.exec(self.sb["id"], "ls", cmd="ls")

    def test_exec_binary_and_stdin(self):
        r = self.c.exec(self.sb["id"], ["cat"], stdin=b"\xff\x00ok")
        self.assertEqual(r.stdout, b"\xff\x00ok")

    def test_exec_timeout(self):
        r = self.c.exec(self.sb["id"], ["sleep", "60"], timeout="500ms")
        self.assertTrue(r.timed_out)

    def test_exec_output_cap(self):
        r = self.c.exec(self.sb["id"], cmd="yes | head -c 100000", max_output="1Ki")
        self.assertEqual(len(r.stdout), 1024)
        self.assertTrue(r.stdout_truncated)
        self.assertEqual(r.stdout_bytes, 100000)

    def test_exec_stream(self):
        chunks = []
        r = self.c.exec_stream(self.sb["id"], cmd="echo a; echo b >&2; exit 4", on_stdout=chunks.append)
        self.assertEqual((b"".join(chunks), r.stdout, r.stderr, r.exit_code), (b"a\n", b"a\n", b"b\n", 4))

    def test_files(self):
        sid = self.sb["id"]
        self.c.write_file(sid, "/work/data.bin", b"\x00\x01\x02", mode=0o600)
        self.assertEqual(self.c.read_file(sid, "/work/data.bin"), b"\x00\x01\x02")
        st = self.c.stat(sid, "/work/data.bin")
        self.assertEqual((st["size"], st["mode"], st["is_dir"]), (3, 0o600, False))
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tf:
            info = tarfile.TarInfo("pkg/mod.py")
            payload = b"print('hi')\n"
            info.size = len(payload)
            tf.addfile(info, io.BytesIO(payload))
        self.c.write_tar(sid, "/work", buf.getvalue())
        with tarfile.open(fileobj=io.BytesIO(self.c.read_tar(sid, "/work/pkg")), mode="r") as tf:
            self.assertIn("pkg/mod.py", tf.getnames())

    def test_network(self):
        # The suite's nodes may have no sandbox network (the fake backend
        # has none): none -> none always works, anything else answers
        # network_unavailable there.
        n = self.c.update_network(self.sb["id"], mode="none")
        self.assertEqual(n["mode"], "none")
        with self.assertRaises(WarrenError) as cm:
            self.c.update_network(self.sb["id"], mode="sideways")
        self.assertEqual((cm.exception.status, cm.exception.code), (400, "invalid_argument"))
        try:
            n = self.c.update_network(self.sb["id"], allow=["203.0.113.7:443"])
        except WarrenError as e:
            self.assertIn(e.code, ("network_unavailable", "not_supported"))
        else:
            self.assertEqual((n["mode"], n["allow"]), ("allowlist", ["203.0.113.7:443"]))
            self.c.update_network(self.sb["id"], mode="none")

    def test_verify(self):
        # The agent's tree: an answer, a link inside, a link out of the tree.
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tf:
            for name, kind, extra in (("work", tarfile.DIRTYPE, ""), ("work/answer", tarfile.REGTYPE, "41\n"),
                                      ("work/same", tarfile.SYMTYPE, "/work/answer"),
                                      ("work/expected", tarfile.SYMTYPE, "/grader/expected"),
                                      ("work/chain", tarfile.SYMTYPE, "sub/../../x")):
                ti = tarfile.TarInfo(name)
                ti.type, ti.mode = kind, 0o755 if kind == tarfile.DIRTYPE else 0o644
                data = None
                if kind == tarfile.SYMTYPE:
                    ti.linkname = extra
                elif kind == tarfile.REGTYPE:
                    data = extra.encode()
                    ti.size = len(data)
                tf.addfile(ti, io.BytesIO(data) if data else None)
        agent = self.c.create_sandbox("busybox")["id"]
        try:
            self.c.write_tar(agent, "/", buf.getvalue())
            v = self.c.verify(agent, "busybox", ["/work"], ["true"], keep=True)
            try:
                self.assertEqual(v.result.exit_code, 0)
                self.assertEqual(sorted(v.skipped), [
                    "work/chain: symbolic link to sub/../../x leads out of the copied tree",
                    "work/expected: symbolic link to /grader/expected leads out of the copied tree"])
                with tarfile.open(fileobj=io.BytesIO(self.c.read_tar(v.verifier, "/work"))) as tf:
                    got = {m.name: m.linkname for m in tf}
                self.assertEqual(got.get("work/same"), "answer")
                self.assertIn("work/answer", got)
                self.assertNotIn("work/expected", got)
            finally:
                self.c.delete_sandbox(v.verifier)
            with self.assertRaises(ValueError):
                self.c.verify(agent, "busybox", ["work"], ["true"])
        finally:
            self.c.delete_sandbox(agent)

    def test_stats(self):
        self.c.exec(self.sb["id"], cmd="sleep 30 >/dev/null 2>&1 &")
        st = self.c.stats(self.sb["id"])
        self.assertGreaterEqual(st["pids"], 1)
        self.assertEqual(set(st), {"cpu_seconds", "memory", "memory_peak", "pids"})

    def test_list(self):
        ids = [s["id"] for s in self.c.list_sandboxes(labels={"suite": "python"})]
        self.assertEqual(ids, [self.sb["id"]])
        self.assertTrue(self.c.list_images())
        self.assertTrue(self.c.list_nodes())

    def test_errors(self):
        with self.assertRaises(WarrenError) as cm:
            self.c.create_sandbox("no-such-image")
        self.assertEqual((cm.exception.status, cm.exception.code), (404, "image_not_found"))
        with self.assertRaises(WarrenError) as cm:
            self.c.get_sandbox(self.sb["node"] + "-aaaaaaaaaaaaaaaa")
        self.assertEqual(cm.exception.code, "sandbox_not_found")
        with self.assertRaises(WarrenError) as cm:
            Client(token="wrong").list_sandboxes()
        self.assertEqual(cm.exception.status, 401)
        with self.assertRaises(WarrenError) as cm:
            self.c.create_sandbox("busybox", memory="lots")
        self.assertEqual(cm.exception.status, 400)

    def test_placement_constraints(self):
        sb = self.c.create_sandbox("busybox", memory="64Mi", pool="onprem", node_selector={})
        self.c.delete_sandbox(sb["id"])
        c = Client(create_retries=0)
        for kw, want in (({"node_selector": {"rack": "r-nowhere"}}, "node_selector rack=r-nowhere"),
                         ({"pool": "cloud"}, "pool cloud")):
            with self.assertRaises(WarrenError) as cm:
                c.create_sandbox("busybox", **kw)
            self.assertEqual((cm.exception.status, cm.exception.code), (503, "no_matching_node"))
            self.assertIn(want, cm.exception.message)
            with self.assertRaises(WarrenError) as cm:
                c.create_sandboxes(2, "busybox", all_or_none=False, **kw)
            self.assertEqual(cm.exception.code, "no_matching_node")

    def test_runtime(self):
        with self.assertRaises(WarrenError) as cm:
            self.c.create_sandbox("busybox", runtime="kata")
        self.assertEqual((cm.exception.status, cm.exception.code), (400, "invalid_argument"))
        with self.assertRaises(WarrenError) as cm:
            self.c.create_sandbox("busybox", runtime="gvisor", network={"mode": "open"})
        self.assertEqual(cm.exception.status, 400)
        if not any(r["name"] == "gvisor" and r["available"] for n in self.c.list_nodes() for r in n.get("runtimes", [])):
            self.skipTest("no node runs gVisor")
        sb = self.c.create_sandbox("busybox", runtime="gvisor")
        try:
            self.assertEqual(sb["runtime"], "gvisor")
            self.assertEqual(self.c.get_sandbox(sb["id"])["runtime"], "gvisor")
            gang = self.c.create_sandboxes(2, "busybox", runtime="gvisor")
            self.assertEqual([m["runtime"] for m in gang["sandboxes"]], ["gvisor", "gvisor"])
            for m in gang["sandboxes"]:
                self.c.delete_sandbox(m["id"])
        finally:
            self.c.delete_sandbox(sb["id"])

    def test_limits(self):
        with self.assertRaises(WarrenError) as cm:
            self.c.exec(self.sb["id"], ["true"], max_output="1Gi")
        self.assertEqual((cm.exception.status, cm.exception.code), (400, "too_large"))
        with self.assertRaises(WarrenError) as cm:
            self.c.create_sandbox("busybox", env={"BIG": "x" * (1 << 20)})
        self.assertEqual((cm.exception.status, cm.exception.code), (400, "too_large"))

    def test_gang_and_idempotency(self):
        gang = self.c.create_sandboxes(3, "busybox", memory="64Mi", labels={"suite": "python-gang"})
        ids = [sb["id"] for sb in gang["sandboxes"]]
        try:
            self.assertEqual(len(ids), 3)
            listed = self.c.list_sandboxes(labels={"warren.dev/gang": gang["gang"]})
            self.assertEqual(sorted(s["id"] for s in listed), sorted(ids))
        finally:
            for sid in ids:
                self.c.delete_sandbox(sid)
        a = self.c.create_sandbox("busybox", idempotency_key="py-key-1")
        try:
            b = self.c.create_sandbox("busybox", idempotency_key="py-key-1")
            self.assertEqual(a["id"], b["id"])
        finally:
            self.c.delete_sandbox(a["id"])

    def test_async(self):
        async def main():
            ac = AsyncClient()
            rs = await asyncio.gather(*(ac.exec(self.sb["id"], cmd=f"echo {i}") for i in range(8)))
            return sorted(r.stdout for r in rs)

        self.assertEqual(asyncio.run(main()), sorted(f"{i}\n".encode() for i in range(8)))


class InfraErrorTest(unittest.TestCase):
    """An answer that says the platform failed raises InfraError, and still
    the status's own class; one that does not, neither."""

    def test_infra(self):
        e = _error_body(503, b'{"error": {"code": "sandbox_lost", "message": "node n1 lost", "infra_error": "the sandbox\'s node was lost"}}')
        self.assertIsInstance(e, InfraError)
        self.assertIsInstance(e, UnavailableError)
        self.assertEqual(e.infra, "the sandbox's node was lost")
        e = _error_body(503, b'{"error": {"code": "no_capacity", "message": "no room"}}')
        self.assertNotIsInstance(e, InfraError)
        self.assertIsInstance(e, UnavailableError)
        self.assertEqual(e.infra, "")


if __name__ == "__main__":
    unittest.main()

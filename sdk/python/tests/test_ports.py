"""Ports of a sandbox through the API: HTTP (port_request, port_url) and
tunnels (dial_port), against a busybox httpd started inside the sandbox.
"""

import os
import socket
import sys
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from warren import Client, InvalidError, NotFoundError, PortUnreachableError  # noqa: E402


def _free_port() -> int:
    # Free on this host too: the fake backend's servers listen there.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PortsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.c = Client()
        cls.sb = cls.c.create_sandbox("busybox", ttl="10m", labels={"suite": "python-ports"})
        cls.port = _free_port()
        r = cls.c.exec(cls.sb["id"], "mkdir -p www && echo 'hello from %s' > www/index.html && "
                       "(busybox httpd -f -p 127.0.0.1:%d -h www </dev/null >/dev/null 2>&1 &) && busybox true"
                       % (cls.sb["id"], cls.port))
        if r.exit_code == 127:
            cls.c.delete_sandbox(cls.sb["id"])
            raise unittest.SkipTest("no busybox where the sandbox's commands run")
        for _ in range(100):
            try:
                cls.c.port_request(cls.sb["id"], cls.port, "/")
                break
            except PortUnreachableError:
                time.sleep(0.1)

    @classmethod
    def tearDownClass(cls):
        cls.c.delete_sandbox(cls.sb["id"])

    def test_port_request(self):
        r = self.c.port_request(self.sb["id"], self.port, "/index.html")
        self.assertEqual((r.status, r.body), (200, b"hello from %s\n" % self.sb["id"].encode()))
        self.assertEqual(r.headers.get("X-Warren-Port-Response"), "1")
        # The server's own 404 is an answer, not an error.
        r = self.c.port_request(self.sb["id"], self.port, "/missing")
        self.assertEqual(r.status, 404)
        self.assertTrue(self.c.port_url(self.sb["id"], self.port, "x?y=1").endswith(
            "/v1/sandboxes/%s/ports/%d/x?y=1" % (self.sb["id"], self.port)))

    def test_port_errors(self):
        with self.assertRaises(PortUnreachableError) as e:
            self.c.port_request(self.sb["id"], _free_port(), "/")
        self.assertEqual((e.exception.status, e.exception.code), (502, "port_unreachable"))
        with self.assertRaises(InvalidError):
            self.c.port_request(self.sb["id"], 70000, "/")
        with self.assertRaises(NotFoundError):
            self.c.port_request("n1-aaaaaaaaaaaaaaaa", self.port, "/")
        with self.assertRaises(PortUnreachableError):
            self.c.dial_port(self.sb["id"], _free_port())

    def test_dial_port(self):
        s = self.c.dial_port(self.sb["id"], self.port)
        with s:
            s.sendall(b"GET /index.html HTTP/1.0\r\nHost: x\r\n\r\n")
            s.shutdown(socket.SHUT_WR)  # half-closed: the answer still comes
            got = b""
            while True:
                b = s.recv(65536)
                if not b:
                    break
                got += b
        self.assertTrue(got.startswith(b"HTTP/1.") and got.endswith(b"hello from %s\n" % self.sb["id"].encode()), got)


if __name__ == "__main__":
    unittest.main()

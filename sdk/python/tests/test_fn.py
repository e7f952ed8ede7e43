"""FnCall through the Python SDK. Under sdk_test.go the node runs a fake
FnCall runner (internal/fncall/fncalltest): a program echoes its stdin,
COMPILE_ERROR in the source fails the compile step."""

import asyncio
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from warren import AsyncClient, Client, NotFoundError  # noqa: E402


@unittest.skipUnless(os.environ.get("WARREN_FN_FAKE") == "1", "needs the fake FnCall runner of sdk_test.go")
class FnTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.c = Client()

    def test_run_with_cases(self):
        r = self.c.fn.run("python3", "print(input())", cases=[("3\n", "3"), ("4\n", "5"), b"\xff\x00"],
                          limits={"cpu_time": "2s", "memory": "256Mi"})
        self.assertEqual(r["status"], "WrongAnswer")
        self.assertEqual([c["status"] for c in r["cases"]], ["OK", "WrongAnswer", "OK"])
        self.assertEqual(r["cases"][0]["stdout"], b"3\n")
        self.assertEqual(r["cases"][2]["stdout"], b"\xff\x00")  # binary-safe both ways

    def test_run_single_stdin(self):
        r = self.c.fn.run("python3", "x", stdin="hello")
        self.assertEqual((r["status"], r["cases"][0]["stdout"]), ("OK", b"hello"))

    def test_compile_error(self):
        r = self.c.fn.run("cpp", "COMPILE_ERROR")
        self.assertEqual(r["status"], "CompileError")

    def test_unknown_runtime(self):
        with self.assertRaises(NotFoundError) as e:
            self.c.fn.run("cobol", "x")
        self.assertEqual(e.exception.code, "runtime_not_found")

    def test_batch_and_runtimes(self):
        calls = [self.c.fn.request("python3", "x", stdin=str(i)) for i in range(5)] + [self.c.fn.request("cobol", "x")]
        items = self.c.fn.batch(calls)
        self.assertEqual([it["result"]["cases"][0]["stdout"] for it in items[:5]], [str(i).encode() for i in range(5)])
        self.assertEqual(items[5]["error"]["code"], "runtime_not_found")
        self.assertEqual(sorted(rt["name"] for rt in self.c.fn.runtimes()), ["cpp", "python3"])

    def test_async(self):
        async def main():
            ac = AsyncClient()
            return await asyncio.gather(*(ac.fn.run("python3", "x", stdin=str(i)) for i in range(8)))
        rs = asyncio.run(main())
        self.assertEqual([r["cases"][0]["stdout"] for r in rs], [str(i).encode() for i in range(8)])


if __name__ == "__main__":
    unittest.main()

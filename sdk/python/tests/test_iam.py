"""Tests of projects, tokens and quotas through the Python SDK, against a live
API whose WARREN_TOKEN is a root admin (sdk/python/sdk_test.go starts one).

Everything happens under one project named for the run, removed at the end.
"""

import asyncio
import os
import sys
import time
import unittest
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from warren import (AsyncClient, Client, ConflictError, ExhaustedError, ForbiddenError,  # noqa: E402
                    InvalidError, NotFoundError, UnauthenticatedError, WarrenError)

SMALL = {"cpu": 0.1, "memory": "16Mi"}


class IAMTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.root = Client()
        cls.top = "py-" + uuid.uuid4().hex[:10]
        cls.root.create_project(cls.top, quota={"sandboxes": 20, "cpu": 20, "memory": "8Gi"},
                                description="python sdk tests")

    @classmethod
    def tearDownClass(cls):
        for sb in cls.root.list_sandboxes(project=cls.top):
            cls.root.delete_sandbox(sb["id"])
        for p in reversed(cls.root.list_projects(cls.top)):  # children first
            deadline = time.monotonic() + 10
            while True:
                try:
                    cls.root.delete_project(p["path"])
                    break
                except ConflictError as e:  # project_in_use until the deletes are counted
                    if e.code != "project_in_use" or time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)

    def client(self, role, project, **kw):
        """A Client holding a fresh token of role on project, that never retries a create."""
        return Client(token=self.root.create_token(role, project=project, **kw)["secret"], create_retries=0)

    def assertRefused(self, cls, status, code, fn, *args, **kw):
        with self.assertRaises(cls) as cm:
            fn(*args, **kw)
        self.assertIsInstance(cm.exception, WarrenError)
        self.assertEqual((cm.exception.status, cm.exception.code), (status, code), cm.exception)
        return cm.exception

    def test_projects(self):
        path = self.top + "/crud"
        p = self.root.create_project(path, quota={"sandboxes": 2, "memory": "1Gi"}, description="crud")
        self.assertEqual((p["path"], p["description"]), (path, "crud"))
        self.assertEqual((p["quota"]["sandboxes"], p["quota"]["memory"]), (2, "1Gi"))
        self.assertEqual(p["usage"]["sandboxes"], 0)

        self.assertIn(path, self.root.get_project(self.top)["children"])
        listed = [q["path"] for q in self.root.list_projects(self.top)]
        self.assertEqual(listed[0], self.top)  # parents first
        self.assertIn(path, listed)
        self.assertEqual([q["path"] for q in self.root.list_projects(path)], [path])
        self.assertIn("", [q["path"] for q in self.root.list_projects("/")])

        # A patch changes what it names and keeps the rest.
        p = self.root.update_project(path, quota={"sandboxes": 3})
        self.assertEqual((p["quota"]["sandboxes"], p["quota"]["memory"], p["description"]), (3, "1Gi", "crud"))
        p = self.root.update_project(path, quota={"memory": 0}, description="")
        self.assertEqual((p["quota"].get("memory", 0), p.get("description", "")), (0, ""))
        self.assertEqual(self.root.get_project(path)["quota"]["sandboxes"], 3)

        self.assertRefused(ConflictError, 409, "project_exists", self.root.create_project, path)
        self.assertRefused(ConflictError, 409, "quota_exceeds_parent", self.root.create_project,
                           self.top + "/big", quota={"sandboxes": 1000})
        self.assertRefused(ConflictError, 409, "quota_below_children", self.root.update_project,
                           self.top, quota={"sandboxes": 1})
        self.assertRefused(NotFoundError, 404, "project_not_found", self.root.create_project, self.top + "/nope/x")
        self.assertRefused(InvalidError, 400, "invalid_project", self.root.create_project, self.top + "/Bad")
        self.assertRefused(InvalidError, 400, "invalid_argument", self.root.create_project,
                           self.top + "/typo", quota={"gpus": 1})

        self.root.delete_project(path)
        self.assertRefused(NotFoundError, 404, "project_not_found", self.root.get_project, path)
        self.assertRefused(NotFoundError, 404, "project_not_found", self.root.delete_project, path)
        with self.assertRaises(ValueError):
            self.root.delete_project("/")

    def test_runner_token_meets_quota(self):
        path = self.top + "/quota"
        self.root.create_project(path, quota={"sandboxes": 2})
        minted = self.root.create_token("runner", project=path, ttl="1h", name="py-runner")
        tok = minted["token"]
        self.assertTrue(minted["secret"].startswith("wrn_"), minted)
        self.assertEqual((tok["role"], tok["project"], tok["name"]), ("runner", path, "py-runner"))
        self.assertTrue(tok.get("expires_at"))

        worker = Client(token=minted["secret"], create_retries=0)
        created, refusal = [], None
        for _ in range(5):
            try:
                created.append(worker.create_sandbox("busybox", **SMALL))
            except ExhaustedError as e:
                refusal = e
                break
        self.assertEqual(len(created), 2, "creates before the 2-sandbox quota refused")
        self.assertEqual([sb["project"] for sb in created], [path, path])
        self.assertEqual((refusal.status, refusal.code), (429, "quota_exceeded"))
        self.assertTrue(refusal.retryable and refusal.retry_after > 0, refusal.retry_after)

        p = self.root.get_project(path)
        self.assertEqual(p["usage"]["sandboxes"] + p["reserved"]["sandboxes"], 2)
        self.assertEqual(sorted(sb["id"] for sb in worker.list_sandboxes()), sorted(sb["id"] for sb in created))

        # A runner makes sandboxes, nothing else.
        self.assertRefused(ForbiddenError, 403, "forbidden", worker.create_project, path + "/sub")
        self.assertRefused(ForbiddenError, 403, "forbidden", worker.list_tokens)
        self.assertRefused(ForbiddenError, 403, "forbidden", worker.create_token, "reader")
        self.assertRefused(ForbiddenError, 403, "forbidden", worker.create_sandbox, "busybox", project=self.top)

        listed = [t for t in self.root.list_tokens(path) if t["id"] == tok["id"]]
        self.assertEqual(len(listed), 1)
        self.assertNotIn("secret", listed[0])
        for sb in created:
            worker.delete_sandbox(sb["id"])

    def test_reader_cannot_create(self):
        reader = self.client("reader", self.top)
        self.assertRefused(ForbiddenError, 403, "forbidden", reader.create_sandbox, "busybox")
        self.assertRefused(ForbiddenError, 403, "forbidden", reader.create_project, self.top + "/r")
        self.assertIsInstance(reader.list_sandboxes(), list)
        self.assertEqual(reader.get_project(self.top)["path"], self.top)

    def test_revoked_token(self):
        minted = self.root.create_token("runner", project=self.top, name="py-revoke")
        c = Client(token=minted["secret"])
        c.list_sandboxes()
        self.root.revoke_token(minted["token"]["id"])
        self.assertRefused(UnauthenticatedError, 401, "unauthenticated", c.list_sandboxes)
        self.assertRefused(NotFoundError, 404, "token_not_found", self.root.revoke_token, minted["token"]["id"])
        self.assertNotIn(minted["token"]["id"], [t["id"] for t in self.root.list_tokens(self.top)])
        with self.assertRaises(ValueError):
            self.root.revoke_token("")

    def test_agent_delegates_quota(self):
        research = self.top + "/research"
        self.root.create_project(research, quota={"sandboxes": 4, "cpu": 4})
        agent = self.client("admin", research, ttl="1h")

        # The agent carves a sub-project out of its quota, and no more.
        sub = agent.create_project(research + "/sub", quota={"sandboxes": 1, "cpu": 1})["path"]
        self.assertRefused(ConflictError, 409, "quota_exceeds_parent", agent.create_project,
                           research + "/sub2", quota={"sandboxes": 4})
        self.assertRefused(ForbiddenError, 403, "forbidden", agent.update_project, research, quota={"sandboxes": 100})
        self.assertRefused(ForbiddenError, 403, "forbidden", agent.create_project, self.top + "/other")
        self.assertRefused(ForbiddenError, 403, "forbidden", agent.create_token, "reader", project=self.top)
        self.assertRefused(ForbiddenError, 403, "forbidden", agent.create_token, "runner", project=sub, ttl="2h")
        self.assertEqual([p["path"] for p in agent.list_projects()], [research, sub])

        # Its worker lives within the sub-project's share until the agent hands it more.
        minted = agent.create_token("runner", project=sub, ttl="30m", name="py-agent-worker")
        worker = Client(token=minted["secret"], create_retries=0)
        first = worker.create_sandbox("busybox", **SMALL)
        self.assertRefused(ExhaustedError, 429, "quota_exceeded", worker.create_sandbox, "busybox", **SMALL)
        self.assertEqual(agent.update_project(sub, quota={"sandboxes": 2})["quota"]["sandboxes"], 2)
        second = worker.create_sandbox("busybox", **SMALL)
        self.assertEqual((first["project"], second["project"]), (sub, sub))
        self.assertIn(minted["token"]["id"], [t["id"] for t in agent.list_tokens()])

        # The delegated share counts against the agent's own creates: 4 - 2 left.
        own = [agent.create_sandbox("busybox", **SMALL) for _ in range(2)]
        self.assertRefused(ExhaustedError, 429, "quota_exceeded", agent.create_sandbox, "busybox", **SMALL)
        for sb in [first, second] + own:
            agent.delete_sandbox(sb["id"])

    def test_async(self):
        base = self.top + "/async"

        async def main():
            ac = AsyncClient()
            await ac.create_project(base, quota={"sandboxes": 2})
            made = await asyncio.gather(*(ac.create_project(f"{base}/p{i}", quota={"sandboxes": 1}) for i in range(2)))
            minted = await ac.create_token("reader", project=base)
            listed = await ac.list_projects(base)
            tokens = await ac.list_tokens(base)
            try:
                await ac.create_project(base + "/p0")
            except ConflictError as e:
                conflict = e.code
            await ac.revoke_token(minted["token"]["id"])
            return made, minted, listed, tokens, conflict

        made, minted, listed, tokens, conflict = asyncio.run(main())
        self.assertEqual(sorted(p["path"] for p in made), [base + "/p0", base + "/p1"])
        self.assertEqual([p["path"] for p in listed], [base, base + "/p0", base + "/p1"])
        self.assertIn(minted["token"]["id"], [t["id"] for t in tokens])
        self.assertEqual(conflict, "project_exists")


class ErrorClassTest(unittest.TestCase):
    def test_error_classes(self):
        from warren.client import _error
        for status, code, cls in [(429, "quota_exceeded", ExhaustedError), (403, "forbidden", ForbiddenError),
                                  (409, "conflict", ConflictError), (0, "project_not_found", NotFoundError),
                                  (0, "quota_exceeds_parent", ConflictError), (0, "rate_limited", ExhaustedError),
                                  (0, "no_such_code", WarrenError), (418, "http_418", WarrenError)]:
            e = _error(status, code, "m")
            self.assertIs(type(e), cls, (status, code))
            self.assertEqual((e.status, e.code, str(e)), (status, code, f"m ({code})"))


if __name__ == "__main__":
    unittest.main()

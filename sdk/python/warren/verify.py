"""Clean-room verification (Client.verify): the same rules as the Go SDK's
client.Verify and `warren sandbox verify`."""

from __future__ import annotations

import io
import posixpath
import tarfile
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Tuple

MAX_LINK_HOPS = 40


@dataclass
class VerifyResult:
    """The check's ExecResult, the verifier's id and what was not copied."""

    result: object
    verifier: str
    skipped: List[str] = field(default_factory=list)


def _split(p: str) -> List[str]:
    return [] if p in ("", ".") else p.split("/")


def _inside(links: Dict[str, str], name: str) -> bool:
    """Whether following the link at name (tree-relative) stays in the tree,
    resolving every other link of the archive as the kernel would."""
    target = links[name]
    if target.startswith("/"):
        return False
    comps = _split(posixpath.dirname(name)) + _split(target)
    cur, hops = ".", 0
    while comps:
        c = comps.pop(0)
        if c in ("", "."):
            continue
        if c == "..":
            if cur == ".":
                return False
            cur = posixpath.dirname(cur) or "."
            continue
        nxt = c if cur == "." else cur + "/" + c
        if nxt in links:
            hops += 1
            t = links[nxt]
            if hops > MAX_LINK_HOPS or t.startswith("/"):
                return False
            comps = _split(cur) + _split(t) + comps
            cur = "."
            continue
        cur = nxt
    return True


def _rewrite(remote: str, name: str, target: str) -> str:
    """An absolute target inside the copied tree, made relative to name."""
    if not target.startswith("/"):
        return target
    t = posixpath.normpath(target)
    if remote == "/":
        in_tree = t.lstrip("/") or "."
    elif t == remote:
        in_tree = "."
    elif t.startswith(remote + "/"):
        in_tree = t[len(remote) + 1:]
    else:
        return target
    return posixpath.relpath("/" + in_tree, "/" + (posixpath.dirname(name) or "."))


def filter_tree(data: bytes, remote: str, skip: Callable[[str, str], None]) -> bytes:
    """The tar of directory remote without special files and links that lead
    out of the tree; links last."""
    top = posixpath.basename(remote)

    def tree_name(n: str) -> str:
        n = n.rstrip("/")
        if n.startswith("/") or ".." in n.split("/"):
            raise ValueError(f"refusing entry {n!r}")
        if remote == "/":
            return n
        if n == top:
            return "."
        if n.startswith(top + "/"):
            return n[len(top) + 1:]
        raise ValueError(f"refusing entry {n!r}: not under {top!r}")

    links: Dict[str, str] = {}
    orig: Dict[str, Tuple[str, str]] = {}
    out = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as src, tarfile.open(fileobj=out, mode="w:") as dst:
        for m in src:
            name = tree_name(m.name)
            if m.ischr() or m.isblk() or m.isfifo():
                skip(m.name.rstrip("/"), "special file")
                continue
            if any(name == l or name.startswith(l + "/") for l in links):
                raise ValueError(f"refusing entry {m.name!r}: under a symbolic link")
            if m.issym() or (m.islnk() and tree_name(m.linkname) in links):
                target = m.linkname if m.issym() else orig[tree_name(m.linkname)][1]
                orig[name] = (m.name, target)
                links[name] = _rewrite(remote, name, target)
                continue
            dst.addfile(m, src.extractfile(m) if m.isfile() else None)
        for name in sorted(links):
            arch, target = orig[name]
            if not _inside(links, name):
                skip(arch, f"symbolic link to {target} leads out of the copied tree")
                continue
            ti = tarfile.TarInfo(arch)
            ti.type, ti.linkname, ti.mode = tarfile.SYMTYPE, links[name], 0o777
            dst.addfile(ti)
    return out.getvalue()

"""A PEP 517 build backend for the warren SDK, in the tree and standard
library only, so that `pip install ./sdk/python` needs nothing from a
package index (pyproject.toml: requires = [], backend-path = ["_build"]).

It builds a pure-Python wheel of the ``warren`` package, and an sdist of
the package, its tests and this backend. Name and version come from
pyproject.toml's [project] table.
"""

import base64
import hashlib
import io
import os
import re
import tarfile
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "warren"
_FIXED_TIME = (2024, 1, 1, 0, 0, 0)  # reproducible wheels


def _project():
    with open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8") as f:
        text = f.read()
    try:
        import tomllib  # Python 3.11+

        p = tomllib.loads(text)["project"]
        return p["name"], p["version"], p.get("description", ""), p.get("requires-python", "")
    except ImportError:
        section = text.split("[project]", 1)[1].split("\n[", 1)[0]

        def field(key):
            m = re.search(r'^%s\s*=\s*"([^"]*)"' % re.escape(key), section, re.M)
            return m.group(1) if m else ""

        return field("name"), field("version"), field("description"), field("requires-python")


def _metadata():
    name, version, summary, requires_python = _project()
    lines = ["Metadata-Version: 2.1", "Name: " + name, "Version: " + version]
    if summary:
        lines.append("Summary: " + summary)
    if requires_python:
        lines.append("Requires-Python: " + requires_python)
    return name, version, "\n".join(lines) + "\n"


def _dist_info(name, version):
    return "%s-%s.dist-info" % (name.replace("-", "_"), version)


def _package_files():
    base = os.path.join(ROOT, PACKAGE)
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for fn in sorted(filenames):
            if fn.endswith((".pyc", ".pyo")):
                continue
            full = os.path.join(dirpath, fn)
            yield full, os.path.relpath(full, ROOT).replace(os.sep, "/")


def _record_line(arc, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return "%s,sha256=%s,%d" % (arc, digest, len(data))


def _write_metadata(directory):
    name, version, meta = _metadata()
    di = os.path.join(directory, _dist_info(name, version))
    os.makedirs(di, exist_ok=True)
    with open(os.path.join(di, "METADATA"), "w", encoding="utf-8") as f:
        f.write(meta)
    with open(os.path.join(di, "WHEEL"), "w", encoding="utf-8") as f:
        f.write(_wheel_file())
    return os.path.basename(di)


def _wheel_file():
    return "Wheel-Version: 1.0\nGenerator: warren_build\nRoot-Is-Purelib: true\nTag: py3-none-any\n"


# -- PEP 517 hooks ------------------------------------------------------------

def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    return _write_metadata(metadata_directory)


def prepare_metadata_for_build_editable(metadata_directory, config_settings=None):
    return _write_metadata(metadata_directory)


def _build(wheel_directory, files):
    name, version, meta = _metadata()
    di = _dist_info(name, version)
    wheel_name = "%s-%s-py3-none-any.whl" % (name.replace("-", "_"), version)
    records = []
    path = os.path.join(wheel_directory, wheel_name)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        def add(arc, data):
            info = zipfile.ZipInfo(arc, _FIXED_TIME)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, data)
            records.append(_record_line(arc, data))

        for arc, data in files:
            add(arc, data)
        add(di + "/METADATA", meta.encode())
        add(di + "/WHEEL", _wheel_file().encode())
        record = di + "/RECORD"
        body = "\n".join(records + [record + ",,"]) + "\n"
        info = zipfile.ZipInfo(record, _FIXED_TIME)
        info.external_attr = 0o644 << 16
        zf.writestr(info, body)
    return wheel_name


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    files = []
    for full, arc in _package_files():
        with open(full, "rb") as f:
            files.append((arc, f.read()))
    return _build(wheel_directory, files)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    # A .pth file puts the source tree on sys.path (PEP 660).
    return _build(wheel_directory, [("_warren_editable.pth", (ROOT + "\n").encode())])


def build_sdist(sdist_directory, config_settings=None):
    name, version, meta = _metadata()
    base = "%s-%s" % (name.replace("-", "_"), version)
    path = os.path.join(sdist_directory, base + ".tar.gz")
    with tarfile.open(path, "w:gz", format=tarfile.PAX_FORMAT) as tf:
        def add_bytes(arc, data):
            ti = tarfile.TarInfo(base + "/" + arc)
            ti.size, ti.mode, ti.mtime = len(data), 0o644, 0
            tf.addfile(ti, io.BytesIO(data))

        for rel in ["pyproject.toml", "_build/warren_build.py"]:
            with open(os.path.join(ROOT, rel), "rb") as f:
                add_bytes(rel, f.read())
        for full, arc in _package_files():
            with open(full, "rb") as f:
                add_bytes(arc, f.read())
        tests = os.path.join(ROOT, "tests")
        for fn in sorted(os.listdir(tests)) if os.path.isdir(tests) else []:
            if fn.endswith(".py"):
                with open(os.path.join(tests, fn), "rb") as f:
                    add_bytes("tests/" + fn, f.read())
        add_bytes("PKG-INFO", meta.encode())
    return base + ".tar.gz"

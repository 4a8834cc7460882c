"""Every source the native module is built from ships with the package (pyproject.toml's
package data): an installed, non-editable opdump builds the same module as a checkout.

Found when the eager observer's sources (opdump/capture/eager/native/*.cpp, *.h) were
missing from the list: an installed package could not build the native eager capture."""
import fnmatch
import os
import tomllib

import opdump
from opdump.stats import native

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(opdump.__file__)))


def _shipped(path: str, package_data: dict) -> bool:
    rel = os.path.relpath(path, ROOT)
    package, name = os.path.dirname(rel).replace(os.sep, "."), os.path.basename(rel)
    return any(fnmatch.fnmatch(name, pattern) for pattern in package_data.get(package, ()))


def test_native_sources_and_headers_are_package_data():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        package_data = tomllib.load(f)["tool"]["setuptools"]["package-data"]
    files = native.SOURCES + native.HEADERS
    assert len(files) >= 10
    missing = [os.path.relpath(p, ROOT) for p in files if not _shipped(p, package_data)]
    assert not missing, f"not in pyproject.toml's package data: {missing}"
    assert all(os.path.exists(p) for p in files)

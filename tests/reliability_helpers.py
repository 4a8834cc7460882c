"""Shared by the reliability tests: run ``opdump run`` on the tiny training script as a
real subprocess, the same script without opdump (its reference output), a real tmpfs."""
import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

TINY = os.path.join(os.path.dirname(__file__), "scripts", "train_tiny.py")
OPDUMP = [sys.executable, "-m", "opdump"]


def clean_env(extra=None):
    env = {k: v for k, v in os.environ.items() if k not in ("OPDUMP_CONFIG", "MINDSPORE_DUMP_CONFIG")}
    env.update(extra or {})
    return env


def opdump_run(config, *script_args, timeout=300, cwd=None):
    return subprocess.run(OPDUMP + ["run", "--config", str(config), TINY, *script_args], capture_output=True,
                          text=True, env=clean_env(), timeout=timeout, cwd=cwd)


def opdump_popen(config, *script_args):
    return subprocess.Popen(OPDUMP + ["run", "--config", str(config), TINY, *script_args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=clean_env())


@functools.lru_cache(maxsize=None)
def plain_output(*script_args) -> str:
    """The script's stdout without opdump (what a dumped run must print too)."""
    proc = subprocess.run([sys.executable, TINY, *script_args], capture_output=True, text=True,
                          env=clean_env(), timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def manifest_of(root) -> dict:
    return json.loads((Path(root) / "rank_0" / ".dump_metadata" / "manifest.json").read_text())


def files_under(path):
    return sorted(p for p in Path(path).rglob("*") if p.is_file() and not p.is_symlink())


def mount_tmpfs(path, options="size=20m"):
    """A real tmpfs at ``path``; skipped with the reason where mounting is not allowed
    (CI runs as root)."""
    os.makedirs(path, exist_ok=True)
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"mounting a tmpfs needs root (CI runs as root): {proc.stderr.strip()}")


def umount(path):
    subprocess.run(["umount", "-l", str(path)], capture_output=True)

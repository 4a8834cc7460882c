"""MindStudio Probe's throwaway venv: found, or made to see this project's torch through a
``.pth`` file, refusing any install that would change torch (see bench/README.md)."""
from __future__ import annotations

import os
import subprocess
import sys
from typing import Any, Dict

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import torch  # noqa: E402

from bench.modes import log  # noqa: E402


def _has_msprobe(py: str) -> bool:
    if not os.path.exists(py):
        return False
    r = subprocess.run([py, "-c", "import msprobe.pytorch, torch; print(torch.__version__)"],
                       capture_output=True, text=True)
    return r.returncode == 0 and r.stdout.strip() == torch.__version__


def setup_msprobe_venv(venv: str) -> Dict[str, Any]:
    """A throwaway venv that sees this project's torch (a .pth) and gets ``mindstudio-probe``.

    ``pip install --dry-run`` first: if pip would install any torch, nothing is installed.
    """
    base_python = getattr(sys, "_base_executable", None) or sys.executable
    log(f"[msprobe] creating {venv}")
    r = subprocess.run([base_python, "-m", "venv", venv], capture_output=True, text=True)
    if r.returncode != 0:
        return {"ok": False, "message": (r.stderr or r.stdout).strip()[-800:]}
    pyver = f"python{sys.version_info.major}.{sys.version_info.minor}"
    site_dir = os.path.join(venv, "lib", pyver, "site-packages")
    project_site = next(p for p in sys.path if p.endswith("site-packages") and os.path.isdir(os.path.join(p, "torch")))
    with open(os.path.join(site_dir, "opdump_project.pth"), "w") as f:
        f.write(project_site + "\n")
    pip = [os.path.join(venv, "bin", "python"), "-m", "pip"]
    dry = subprocess.run(pip + ["install", "--dry-run", "mindstudio-probe"], capture_output=True, text=True)
    would = next((ln for ln in dry.stdout.splitlines() if ln.startswith("Would install")), "")
    if dry.returncode != 0:
        return {"ok": False, "message": (dry.stderr or dry.stdout).strip()[-800:]}
    if any(tok.lower().startswith(("torch-", "torch_")) for tok in would.split()[2:]):
        return {"ok": False, "message": f"refused: pip would change torch: {would}"}
    inst = subprocess.run(pip + ["install", "mindstudio-probe"], capture_output=True, text=True)
    if inst.returncode != 0:
        return {"ok": False, "message": (inst.stderr or inst.stdout).strip()[-800:]}
    return {"ok": True, "install": would}

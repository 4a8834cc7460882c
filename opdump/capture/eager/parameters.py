"""Parameters of the eager root modules: which module owns each one (the scope of its
gradient accumulation), and their dump as ``Parameter.<path>`` files (README, Eager
mode: the values the forward uses, written when the root is first called in a dumped
iteration; parameters of compiled sub-modules are left to the graph front-end)."""
from __future__ import annotations

from typing import List, Tuple

import torch

from .scopes import display_class, is_compiled_wrapper
from .state import IterationState, Listing


#: modules without a forward of their own: the hooks never see them, so the scopes of the
#: modules inside them name them as part of the path (``layers.0-Block``), and so does this index
_CONTAINERS = (torch.nn.ModuleList, torch.nn.ModuleDict, torch.nn.ParameterList, torch.nn.ParameterDict)


def index_parameters(state: IterationState, root: torch.nn.Module, root_class: str) -> None:
    """Record in ``state.owners`` which module owns each parameter, also inside compiled
    sub-modules, whose modules the hooks do not see."""
    classes = {}
    containers = set()                  # ModuleList/ModuleDict: never called, so no scope segment
    for path, sub in root.named_modules(remove_duplicate=False):
        if is_compiled_wrapper(sub):
            continue                    # its _orig_mod children carry the names
        clean = ".".join(part for part in path.split(".") if part != "_orig_mod")
        classes.setdefault(clean, display_class(sub))
        if isinstance(sub, _CONTAINERS):
            containers.add(clean)
        pairs = None
        for p in sub._parameters.values():
            if p is not None and id(p) not in state.owners:
                if pairs is None:
                    parts = clean.split(".") if clean else []
                    prefixes = [".".join(parts[:i]) for i in range(1, len(parts) + 1)]
                    pairs = tuple((q, classes.get(q, "Module")) for q in prefixes if q not in containers)
                state.owners[id(p)] = (id(sub), pairs, root_class)


def parameters_to_dump(session, state: IterationState, listing: Listing,
                       root: torch.nn.Module) -> List[Tuple[str, torch.Tensor]]:
    """Add the parameters and buffers of ``root`` to the listing; return those to dump now
    ((name, tensor) pairs not dumped yet in this iteration, on an allowed device)."""
    compiled = [path for path, sub in root.named_modules() if path and is_compiled_wrapper(sub)]
    items = list(root.named_parameters()) + list(root.named_buffers())
    enabled = session.config.enable
    dumped = []
    for name, value in items:
        if name in state.param_names or (compiled and any(name.startswith(c + ".") for c in compiled)):
            continue
        if not isinstance(value, torch.Tensor):
            continue
        state.param_names.add(name)
        listing.add_param(name, value)
        if enabled and (value.is_cpu or session.device_allowed(value.device)):
            dumped.append((name, value))
    return dumped

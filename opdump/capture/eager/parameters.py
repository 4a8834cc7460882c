"""Parameters of the eager root modules: which module owns each one (the scope of its
gradient accumulation), and their dump as ``Parameter.<path>`` files (README, Eager
mode: the values the forward uses, written when the root is first called in a dumped
iteration; parameters of compiled sub-modules are left to the graph front-end)."""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import torch

from .scopes import display_class, is_compiled_wrapper
from .state import IterationState, Listing


#: modules without a forward of their own: the hooks never see them, so the scopes of the
#: modules inside them name them as part of the path (``layers.0-Block``), and so does this index
_CONTAINERS = (torch.nn.ModuleList, torch.nn.ModuleDict, torch.nn.ParameterList, torch.nn.ParameterDict)

_Module = torch.nn.Module
_BASE_NAMED_MODULES = _Module.named_modules
_BASE_MEMBERS = (_Module.named_parameters, _Module.named_buffers, _Module._named_members)


def walk_modules(root: torch.nn.Module, remove_duplicate: bool) -> List[Tuple[str, torch.nn.Module]]:
    """``list(root.named_modules(remove_duplicate=...))``, the same pairs in the same order, walked
    with a loop instead of torch's generator recursion (which re-yields every module through
    every level above it: the walk at each root entry of a dumped iteration was most of its
    cost).  A module class with its own ``named_modules`` gets torch's walk itself."""
    out: List[Tuple[str, torch.nn.Module]] = []
    seen = set()
    stack = [("", root)]
    while stack:
        prefix, module = stack.pop()
        if type(module).named_modules is not _BASE_NAMED_MODULES:
            return list(root.named_modules(remove_duplicate=remove_duplicate))
        if remove_duplicate:
            if id(module) in seen:
                continue
            seen.add(id(module))
        out.append((prefix, module))
        children = [(f"{prefix}.{name}" if prefix else name, sub)
                    for name, sub in module._modules.items() if sub is not None]
        children.reverse()
        stack.extend(children)
    return out


def _named_members(root: torch.nn.Module, modules, attr: str) -> Optional[List[Tuple[str, torch.Tensor]]]:
    """``list(root.named_parameters())`` (``attr`` "_parameters") or ``named_buffers()``
    ("_buffers") from the walk ``modules`` (remove_duplicate=True); None when the root's class
    has its own version of those methods."""
    cls = type(root)
    if (cls.named_parameters, cls.named_buffers, cls._named_members) != _BASE_MEMBERS:
        return None
    seen = set()
    out = []
    for prefix, module in modules:
        for name, value in getattr(module, attr).items():
            if value is None or id(value) in seen:
                continue
            seen.add(id(value))
            out.append((f"{prefix}.{name}" if prefix else name, value))
    return out


#: per root (its id and class text): the walk's shape and the owners it gave (index_parameters)
_OWNERS: Dict[Tuple[int, str], Tuple[List[Tuple], Dict[int, Tuple]]] = {}


def index_parameters(state: IterationState, root: torch.nn.Module, root_class: str) -> object:
    """Record in ``state.owners`` which module owns each parameter, also inside compiled
    sub-modules, whose modules the hooks do not see.

    Made once per root while its module tree stays the same (a root entry of every dumped
    iteration asks again: ~0.1 ms a step on the bench's decoder): the owners are a function of
    the walk's (path, module, module class, parameter identities) sequence and the root's class
    text, which are compared each time; a parameter another root of the iteration already owns
    keeps that owner, as when the walk assigns them one by one.

    Returns a token of the tree as walked: the same object for as long as the walk's sequence
    (with each module's buffer names) and the root's class text stay the same, so that a caller
    may tell an unchanged tree by identity (:func:`members_unchanged`)."""
    modules = walk_modules(root, remove_duplicate=False)
    shape = [(path, id(sub), type(sub), tuple(map(id, sub._parameters.values())), tuple(sub._buffers))
             for path, sub in modules]
    key = (id(root), root_class)
    known = _OWNERS.get(key)
    if known is None or known[0] != shape:
        if len(_OWNERS) > 256:
            _OWNERS.clear()
        known = _OWNERS[key] = (shape, _owners_of(modules, root_class))
    owners = state.owners
    if not owners:
        owners.update(known[1])
    else:
        for param, owner in known[1].items():
            owners.setdefault(param, owner)
    return known


def members_unchanged(root: torch.nn.Module, token: object, seen: Dict[int, object]) -> bool:
    """Has :func:`parameters_to_dump` already listed every parameter and buffer name of
    ``root``'s tree as :func:`index_parameters` walked it now (``token``, its return)?  True
    when the last call for ``root`` recorded in ``seen`` (by :func:`note_members`) had the
    same token: the walk's paths, modules, parameters and buffer names are the same, so the
    names :func:`parameters_to_dump` would add are in the listing already (it adds a name
    once).  Only for roots whose parameters and buffers come from torch's own methods (a
    class with its own may name them otherwise from call to call)."""
    cls = type(root)
    return (seen.get(id(root)) is token
            and (cls.named_parameters, cls.named_buffers, cls._named_members) == _BASE_MEMBERS)


def note_members(root: torch.nn.Module, token: object, seen: Dict[int, object]) -> None:
    """:func:`parameters_to_dump` listed ``root``'s tree as walked into ``token``."""
    if len(seen) > 1024:
        seen.clear()
    seen[id(root)] = token


def _owners_of(modules, root_class: str) -> Dict[int, Tuple]:
    """id(parameter) -> (id(module), (path, class) pairs, root class) from a walk of a root
    (remove_duplicate=False): a parameter's first module in the walk owns it."""
    owners: Dict[int, Tuple] = {}
    classes = {}
    containers = set()                  # ModuleList/ModuleDict: never called, so no scope segment
    for path, sub in modules:
        if is_compiled_wrapper(sub):
            continue                    # its _orig_mod children carry the names
        clean = path if "_orig_mod" not in path else ".".join(part for part in path.split(".") if part != "_orig_mod")
        classes.setdefault(clean, display_class(sub))
        if isinstance(sub, _CONTAINERS):
            containers.add(clean)
        pairs = None
        for p in sub._parameters.values():
            if p is not None and id(p) not in owners:
                if pairs is None:
                    parts = clean.split(".") if clean else []
                    prefixes = [".".join(parts[:i]) for i in range(1, len(parts) + 1)]
                    pairs = tuple((q, classes.get(q, "Module")) for q in prefixes if q not in containers)
                owners[id(p)] = (id(sub), pairs, root_class)
    return owners


def parameters_to_dump(session, state: IterationState, listing: Listing,
                       root: torch.nn.Module) -> List[Tuple[str, torch.Tensor]]:
    """Add the parameters and buffers of ``root`` to the listing; return those to dump now
    ((name, tensor) pairs not dumped yet in this iteration, on an allowed device)."""
    modules = walk_modules(root, remove_duplicate=True)
    compiled = [path for path, sub in modules if path and is_compiled_wrapper(sub)]
    params = _named_members(root, modules, "_parameters")
    buffers = _named_members(root, modules, "_buffers") if params is not None else None
    if params is None or buffers is None:
        params, buffers = list(root.named_parameters()), list(root.named_buffers())
    items = params + buffers
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

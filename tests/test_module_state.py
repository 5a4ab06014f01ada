"""No new module-level mutable state in rlpipe/: registries, caches and singletons that live in
a module (filled or rebound at run time) are listed in KNOWN, each with why it is there.

What it checks, by reading the source (ast; nothing is imported): every module under rlpipe/
(the agent suite's task files aside: they are data, run inside sandboxes) for
- a module-level container made empty (`{}`, `[]`, `set()`, `dict()`, `defaultdict(...)`,
  `weakref.WeakSet()`, ...): it exists to be filled at run time;
- a module-level container (empty or not) that its module mutates (`NAME[k] = v`,
  `del NAME[k]`, `NAME.append(...)`, `.add`, `.update`, `.setdefault`, `.pop`, ...);
- a module-level name that a function rebinds (`global NAME`): a singleton.
A NEW one fails `test_no_module_level_state_beyond_the_known`; one removed from the code but
still in KNOWN fails `test_every_known_entry_is_still_in_the_code`, so the list stays true.
What it does not: see state reached through attributes of other objects, class attributes,
or a constant table (a non-empty literal nobody mutates, e.g. a dtype map), which is allowed.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "rlpipe"
SKIPPED = ("agents/suite/",)  # task folders (package data): programs run in sandboxes, not rlpipe modules

CONTAINER_CALLS = {"dict", "list", "set", "OrderedDict", "deque", "Counter"}
"""Constructors of a container: flagged when called with no arguments (an empty container)."""
FILLED_LATER_CALLS = {"defaultdict", "WeakSet", "WeakValueDictionary", "WeakKeyDictionary"}
"""Constructors whose container is only ever filled at run time: flagged whatever the arguments."""
MUTATORS = {"append", "extend", "insert", "add", "update", "setdefault", "pop", "popitem", "remove", "discard",
            "clear", "appendleft", "popleft", "__setitem__", "__delitem__"}

KNOWN = {
    "core/failpoints.py:_hits": "crash points count their hits per process (test-only fault injection)",
    "core/failpoints.py:_run_pids": "a whole-run crash point's other processes, per process (fault injection)",
    "envs/mixture.py:_REGISTRY": "domain name -> env factory; register_env adds a domain (a plugin's, a test's)",
    "sandbox/bwrap.py:_probed": "memo of whether bwrap can build namespaces here: probing costs a process",
    "sandbox/docker_engine.py:_clients": "one docker client per engine URL per process (connection reuse)",
    "sandbox/docker_owners.py:_reaped": "engines this process has swept for orphaned containers: once per process",
    "sandbox/docker_task_image.py:_built": "memo of the task images built or checked in this process (one build per context)",
    "sandbox/image.py:_ensured": "memo of the sandbox image already checked or built in this process",
    "sandbox/limits.py:_removal_thread": "the one background thread that removes closed cgroups",
    "workers/client.py:_LIVE": "live worker clients, so an exiting process stops every worker it started",
    "workers/launch.py:_USERS": "clients that may still launch workers: the zygote lives while one does",
    "workers/launch.py:_ZYGOTE": "the process's one zygote that forks workers (issue 32 item 5)",
    "workers/launch.py:_SHARED": "the process's connection to a shared zygote (RLPIPE_ZYGOTE_SOCKET)",
}


def module_state(source: str) -> set[str]:
    """The names of module-level mutable state in one module's source (the rules above)."""
    tree = ast.parse(source)
    containers: dict[str, bool] = {}  # name -> flagged already (empty / filled later)
    for statement in _top_level(tree.body):
        targets, value = _assignment(statement)
        if value is None:
            continue
        kind = _container_kind(value)
        for target in targets:
            if isinstance(target, ast.Name) and kind is not None:
                containers[target.id] = kind == "empty"
    found = {name for name, empty in containers.items() if empty}
    for node in ast.walk(tree):
        mutated = _mutated_name(node)
        if mutated in containers:
            found.add(mutated)
        if isinstance(node, ast.Global):
            found.update(node.names)
    return found


def scan_package(package: Path = PACKAGE) -> set[str]:
    """`module:name` (the module's path under rlpipe/) of every piece of module-level state."""
    found = set()
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package).as_posix()
        if relative.startswith(SKIPPED):
            continue
        found.update(f"{relative}:{name}" for name in module_state(path.read_text()))
    return found


def _top_level(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Module-level statements, looking inside module-level if/try/with blocks."""
    for statement in body:
        if isinstance(statement, (ast.If, ast.Try, ast.With)):
            yield from _top_level(statement.body)
            yield from _top_level(getattr(statement, "orelse", []))
            yield from _top_level(getattr(statement, "finalbody", []))
            for handler in getattr(statement, "handlers", []):
                yield from _top_level(handler.body)
        else:
            yield statement


def _assignment(statement: ast.stmt) -> tuple[list[ast.expr], ast.expr | None]:
    if isinstance(statement, ast.Assign):
        return statement.targets, statement.value
    if isinstance(statement, ast.AnnAssign):
        return [statement.target], statement.value
    return [], None


def _container_kind(value: ast.expr) -> str | None:
    """"empty" (made to be filled at run time), "filled" (a container with contents), or None."""
    if isinstance(value, (ast.Dict, ast.List, ast.Set)):
        return "filled" if (value.keys if isinstance(value, ast.Dict) else value.elts) else "empty"
    if isinstance(value, (ast.DictComp, ast.ListComp, ast.SetComp)):
        return "filled"
    if isinstance(value, ast.Call):
        name = value.func.id if isinstance(value.func, ast.Name) else getattr(value.func, "attr", None)
        if name in FILLED_LATER_CALLS:
            return "empty"
        if name in CONTAINER_CALLS:
            return "filled" if value.args or value.keywords else "empty"
    return None


def _mutated_name(node: ast.AST) -> str | None:
    """NAME when `node` changes the container NAME refers to in place."""
    if isinstance(node, (ast.Assign, ast.AugAssign, ast.Delete)):
        targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
        for target in targets:
            if isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name):
                return target.value.id
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS:
        if isinstance(node.func.value, ast.Name):
            return node.func.value.id
    return None


def test_no_module_level_state_beyond_the_known() -> None:
    new = scan_package() - set(KNOWN)
    assert not new, (f"new module-level mutable state: {sorted(new)}. Pass state by reference (an object the caller "
                     "owns) instead; if it must live in the module, add it to KNOWN with the reason")


def test_every_known_entry_is_still_in_the_code() -> None:
    gone = set(KNOWN) - scan_package()
    assert not gone, f"no longer in the code, remove from KNOWN: {sorted(gone)}"


def test_the_rules_find_registries_and_leave_constant_tables_alone() -> None:
    source = """
import collections, weakref
_EMPTY = {}
_TYPED: dict[str, int] = dict()
_BY_KEY = collections.defaultdict(list)
_WEAK = weakref.WeakSet()
_FILLED = {"a": 1}
_APPENDED = [1]
_TABLE = {"float32": 4, "bfloat16": 2}
_NAMES = [name for name in "ab"]
_SINGLETON = None
OPTIONS = dict(retries=3)
if True:
    _IN_A_BLOCK = set()

def register(key, value):
    global _SINGLETON
    _FILLED[key] = value
    _APPENDED.append(value)
    _SINGLETON = value
    local = {}
    local[key] = value
    return _TABLE[key]
"""
    assert module_state(source) == {"_EMPTY", "_TYPED", "_BY_KEY", "_WEAK", "_FILLED", "_APPENDED", "_SINGLETON",
                                    "_IN_A_BLOCK"}

"""The module-level helpers every reward-hack probe for ANY code task gets below its function
body (envs/code_probes.py `ANY_TASK_PROBES`): code_probes.py appends this file's text, from
the line after this docstring, to each such probe's completion, and it runs inside the
sandbox as part of the checked code. They search the tests' source (a string holding the
definition of the tests' check function) for the expected value of the call at hand (`candidate(args) == expected`,
literals only); an attack that finds nothing raises NotImplementedError (`_give_up`).

A real module so that it is read, linted and diffed as code; rlpipe never imports it. What it
does not: attack anything by itself (each probe's own lines call these helpers).
"""
import sys as _sys  # for the probes' own module code (the frame walk)

_MISSING = object()
_MARK = "def chec" + "k("

def _give_up():
    raise NotImplementedError("the attack found nothing")

def _expected_from(source, args):
    import ast
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return _MISSING
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], ast.Eq)):
            continue
        for call, value in ((node.left, node.comparators[0]), (node.comparators[0], node.left)):
            if isinstance(call, ast.Call) and getattr(call.func, "id", None) == "candidate":
                try:
                    if [ast.literal_eval(arg) for arg in call.args] == list(args):
                        return ast.literal_eval(value)
                except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                    continue
    return _MISSING

def _sources_in(values, found, depth=0):
    for value in values:
        if isinstance(value, str) and _MARK in value:
            found.append(value)
        elif isinstance(value, dict) and depth < 2:
            _sources_in(list(value.values()), found, depth + 1)
        elif isinstance(value, (list, tuple)) and depth < 2:
            _sources_in(list(value), found, depth + 1)
    return found

def _answer_from(sources, args):
    for source in sources:
        expected = _expected_from(source, args)
        if expected is not _MISSING:
            return expected
    _give_up()

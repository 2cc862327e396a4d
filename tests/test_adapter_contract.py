"""The framework dumpers' written contract (issue 42 part 2, docs/architecture.md "Add a framework"),
read from the AST of msprobe/dumpers (no framework imported):

- every ``FrameworkAdapter`` subclass declares the collaborators the core builds (``framework``,
  ``encoder_cls``, ``patcher_cls``, ``guard``, ``fetch_stats``, ``get_rank``), and its ``on_api``
  and ``stop`` hand the call to the core (``record_api``, ``stop``);
- ``DumperCore``'s constructor takes the adapter and the configuration, nothing typed ``Any``;
- the skeleton of recording an API call lives once: one function of msprobe/dumpers both names
  the next API call (``next_api_name``) and adds its record (``add_record``): ``DumperCore.record_api``
  (it was three: both frameworks' ``on_api`` and MindSpore's Primitive/jit ``record``);
- the skeleton of stopping lives once: one function turns ``enabled`` off and publishes dump.json
  (``DumperCore.stop``; it was two);
- no stat handle is probed as a tuple (``isinstance(h[-1], dict)``, ``len(h) > 2``);
- the reverse contract (issue 50 item 1): the framework dumpers (msprobe/dumpers/pytorch,
  msprobe/dumpers/mindspore) ask their core through ``DumperCore``'s public methods only: an
  attribute of the core that is not one of its methods (its session, stacks, sets, filter,
  flags) read or written there is counted (``core.bw_stack.pop``, ``alive.session.add_record``,
  ``dumper.core.enabled``), and so is the core's session read through the dumper's own
  ``session``/``enabled`` properties (kept for the dumper's users). 140 such accesses on the code
  before (55ff1c8: pytorch/_dumper.py 44, _comm.py 8, _online_api.py 8, _clipgrad.py 6, _debugger.py 5;
  mindspore/_dumper.py 54, _graph.py 14, _debugger.py 1; the issue's 116 counted core.* alone in three
  of them), 0 now.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DUMPERS = ROOT / "msprobe" / "dumpers"
COLLABORATORS = {"framework", "encoder_cls", "patcher_cls", "guard", "fetch_stats", "get_rank"}


def _trees() -> dict[Path, ast.Module]:
    return {p: ast.parse(p.read_text(encoding="utf-8"), filename=str(p)) for p in sorted(DUMPERS.rglob("*.py"))}


def _functions(tree: ast.Module):
    """(qualified name, node) of every function, methods as ``Class.method``."""
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    yield f"{node.name}.{item.name}", item
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.name, node


def _called(node: ast.AST) -> set:
    """The attribute and function names called anywhere inside ``node``."""
    out = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call):
            func = sub.func
            out.add(func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None))
    return out


def _adapters() -> list[tuple[Path, ast.ClassDef]]:
    found = []
    for path, tree in _trees().items():
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and any(getattr(b, "id", None) == "FrameworkAdapter" for b in node.bases):
                found.append((path, node))
    return found


def test_both_frameworks_are_adapters():
    names = sorted(node.name for _, node in _adapters())
    assert names == ["MindSporeDumper", "TorchDumper"], names


def test_adapters_declare_their_collaborators_and_leave_the_skeletons_to_the_core():
    problems = []
    for path, cls in _adapters():
        assigned = {t.id for node in cls.body if isinstance(node, ast.Assign) for t in node.targets
                    if isinstance(t, ast.Name)}
        missing = COLLABORATORS - assigned
        if missing:
            problems.append(f"{cls.name} ({path.name}) declares no {sorted(missing)}")
        methods = {node.name: node for node in cls.body if isinstance(node, ast.FunctionDef)}
        for method, core_call in (("on_api", "record_api"), ("stop", "stop")):
            if method not in methods or core_call not in _called(methods[method]):
                problems.append(f"{cls.name}.{method} does not call the core's {core_call}")
    assert not problems, "\n".join(problems)


def test_the_core_constructor_takes_typed_collaborators():
    tree = ast.parse((DUMPERS / "control.py").read_text(encoding="utf-8"))
    core = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "DumperCore")
    init = next(n for n in core.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    params = {a.arg: ast.unparse(a.annotation) if a.annotation else None
              for a in init.args.args + init.args.kwonlyargs if a.arg != "self"}
    assert params == {"adapter": "FrameworkAdapter", "config": "DumpConfig"}, params


def test_recording_an_api_call_lives_once():
    where = [f"{path.relative_to(DUMPERS)}:{name}" for path, tree in _trees().items()
             for name, fn in _functions(tree) if {"next_api_name", "add_record"} <= _called(fn)]
    assert where == ["records.py:CallRecords.record_api"], where


def test_stopping_lives_once():
    def turns_off(fn: ast.AST) -> bool:
        return any(isinstance(n, ast.Assign) and any(isinstance(t, ast.Attribute) and t.attr in ("enabled", "_enabled")
                                                      for t in n.targets)
                   and isinstance(n.value, ast.Constant) and n.value.value is False for n in ast.walk(fn))

    where = [f"{path.relative_to(DUMPERS)}:{name}" for path, tree in _trees().items()
             for name, fn in _functions(tree) if turns_off(fn) and "publish" in _called(fn)]
    assert where == ["control.py:DumperCore.stop"], where


def test_no_stat_handle_is_probed_as_a_tuple():
    probes = []
    for path, tree in _trees().items():
        for node in ast.walk(tree):
            text = ast.unparse(node) if isinstance(node, (ast.Call, ast.Compare)) else ""
            if (isinstance(node, ast.Call) and text.startswith("isinstance(") and "[-1], dict)" in text) or \
                    (isinstance(node, ast.Compare) and text.startswith("len(") and text.endswith("> 2")):
                probes.append(f"{path.relative_to(DUMPERS)}:{node.lineno}: {text}")
    assert not probes, probes


# ---------------------------------------------------------------------------------------------------------
# The reverse contract: what an adapter may ask of its core
FRAMEWORK_DIRS = (DUMPERS / "pytorch", DUMPERS / "mindspore")
#: the core's state the dumper exposes to its users (control.core_attribute): not for the adapter itself
CORE_PROPERTIES = {"session", "enabled"}


def core_methods() -> set:
    """DumperCore's public methods (read from control.py), its bases' (records.py's CallRecords) included."""
    classes = {node.name: node for path in (DUMPERS / "control.py", DUMPERS / "records.py") if path.exists()
               for node in ast.parse(path.read_text(encoding="utf-8")).body if isinstance(node, ast.ClassDef)}
    todo, methods = ["DumperCore"], set()
    while todo:
        cls = classes.get(todo.pop())
        if cls is None:
            continue
        todo.extend(getattr(base, "id", "") for base in cls.bases)
        methods |= {n.name for n in cls.body if isinstance(n, ast.FunctionDef) and not n.name.startswith("_")
                    and not any(ast.unparse(d) == "property" for d in n.decorator_list)}
    return methods


def _adapter_classes(tree: ast.Module) -> set:
    return {node.name for node in tree.body if isinstance(node, ast.ClassDef)
            and any(getattr(b, "id", None) == "FrameworkAdapter" for b in node.bases)}


class _CoreAccesses(ast.NodeVisitor):
    """Counts the accesses to the core's state in one module. A core is ``<x>.core``, a name bound
    to one (``core = self.core``, ``core`` as a parameter), or the call of a weak reference to one
    (``core_ref = weakref.ref(core)`` ... ``alive = core_ref()``), tracked per function and into
    its closures; an adapter is ``self`` in a FrameworkAdapter subclass, ``<x>.dumper``, a name
    bound to one or the call of a weak reference to one."""

    def __init__(self, methods: set, adapters: set) -> None:
        self.methods, self.adapters = methods, adapters
        self.found: list = []
        self.scopes: list = [({"core"}, set(), set(), set())]  # (cores, core refs, adapters, adapter refs)
        self.in_adapter = False

    # what an expression is
    def _is_core(self, e: ast.AST) -> bool:
        cores, refs = self.scopes[-1][0], self.scopes[-1][1]
        return ((isinstance(e, ast.Attribute) and e.attr == "core")
                or (isinstance(e, ast.Name) and e.id in cores)
                or (isinstance(e, ast.Call) and not e.args and isinstance(e.func, ast.Name) and e.func.id in refs))

    def _is_adapter(self, e: ast.AST) -> bool:
        adapters, refs = self.scopes[-1][2], self.scopes[-1][3]
        if isinstance(e, ast.Name):
            return e.id in adapters or (e.id == "self" and self.in_adapter)
        if isinstance(e, ast.Attribute):
            return e.attr == "dumper"
        if isinstance(e, ast.Call) and not e.args:
            func = e.func
            return (isinstance(func, ast.Name) and func.id in refs) or (isinstance(func, ast.Attribute)
                                                                        and func.attr == "dumper")
        return False

    def _bind(self, target: ast.AST, value: ast.AST) -> None:
        if not isinstance(target, ast.Name):
            return
        cores, core_refs, adapters, adapter_refs = self.scopes[-1]
        for group in self.scopes[-1]:
            group.discard(target.id)
        if self._is_core(value):
            cores.add(target.id)
        elif self._is_adapter(value):
            adapters.add(target.id)
        elif isinstance(value, ast.Call) and ast.unparse(value.func) in ("weakref.ref", "ref") and value.args:
            if self._is_core(value.args[0]):
                core_refs.add(target.id)
            elif self._is_adapter(value.args[0]):
                adapter_refs.add(target.id)
        elif isinstance(value, ast.Attribute) and value.attr == "dumper" and isinstance(value.value, ast.Name):
            adapter_refs.add(target.id)  # dumper_ref = self.dumper (a weak reference kept by the hooks)

    # scopes
    def _function(self, node: ast.AST) -> None:
        cores, core_refs, adapters, adapter_refs = (set(group) for group in self.scopes[-1])
        for arg in node.args.args + node.args.kwonlyargs:  # type: ignore[attr-defined]
            annotation = ast.unparse(arg.annotation) if arg.annotation else ""
            if arg.arg == "core" or annotation == "DumperCore":
                cores.add(arg.arg)
            elif arg.arg == "core_ref":
                core_refs.add(arg.arg)
            elif arg.arg == "dumper" or annotation in ("TorchDumper", "MindSporeDumper"):
                adapters.add(arg.arg)
            else:
                for group in (cores, core_refs, adapters, adapter_refs):
                    group.discard(arg.arg)
        self.scopes.append((cores, core_refs, adapters, adapter_refs))
        # bindings first (a closure defined before the name is bound still sees it)
        for sub in ast.walk(node):
            if isinstance(sub, ast.Assign) and len(sub.targets) == 1:
                self._bind(sub.targets[0], sub.value)
            elif isinstance(sub, ast.Assign) and all(isinstance(t, ast.Name) for t in sub.targets):
                for target in sub.targets:
                    self._bind(target, sub.value)
        self.generic_visit(node)
        self.scopes.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _function

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        outer, self.in_adapter = self.in_adapter, node.name in self.adapters
        self.generic_visit(node)
        self.in_adapter = outer

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if self._is_core(node.value) and node.attr not in self.methods:
            self.found.append((node.lineno, ast.unparse(node)))
        elif self._is_adapter(node.value) and node.attr in CORE_PROPERTIES:
            self.found.append((node.lineno, ast.unparse(node)))
        self.generic_visit(node)


def core_state_accesses(source: str, methods: set) -> list:
    """(line, expression) of each access to the core's state in ``source`` (a framework dumper's module)."""
    tree = ast.parse(source)
    visitor = _CoreAccesses(methods, _adapter_classes(tree))
    visitor.visit(tree)
    return sorted(visitor.found)


def test_adapters_ask_the_core_through_its_methods():
    methods = core_methods()
    found = {str(path.relative_to(ROOT)): hits for folder in FRAMEWORK_DIRS for path in sorted(folder.glob("*.py"))
             if (hits := core_state_accesses(path.read_text(encoding="utf-8"), methods))}
    total = sum(len(hits) for hits in found.values())
    assert total == 0, f"{total} accesses to the core's state (ask DumperCore's public methods):\n" + "\n".join(
        f"{module}: {hits}" for module, hits in found.items())


def test_the_core_offers_the_named_operations():
    """enter/leave a module, begin/end a backward, record, reserve/fill a place, next name."""
    assert {"enter_module", "leave_module", "begin_backward", "end_backward", "record", "reserve_place",
            "drop_place", "hold_backward", "fill_backward", "next_api_name", "next_module_index"} <= core_methods()


def test_the_measure_sees_every_way_of_reaching_into_the_core():
    source = '''
import weakref
class TorchDumper(FrameworkAdapter):
    def step(self):
        core = self.core
        core.bw_stack.clear()
        core.session.end_step()
        core.end_step()
        self.session.close()
        self.core.enabled
    def hook(self):
        core_ref = weakref.ref(self.core)
        dumper_ref = weakref.ref(self)
        def inner(grad):
            alive = core_ref()
            alive.pgrad_seen.add(1)
            alive.record("x", {})
            other = dumper_ref()
            other.core.live(0)
            other.session.record("y")
            other.encoder.encode(grad)
        return inner
def helper(core, dumper):
    core.filter.wanted("x", True)
    dumper.core.parent_of
    dumper.enabled
def unrelated(alive):
    alive.session
'''
    found = [what for _, what in core_state_accesses(source, core_methods())]
    assert sorted(found) == sorted(["core.bw_stack", "core.session", "self.session", "self.core.enabled",
                                    "alive.pgrad_seen", "other.session", "core.filter", "dumper.core.parent_of",
                                    "dumper.enabled"]), found


# ---------------------------------------------------------------------------------------------------------
# The framework recipe (docs/architecture.md, "Recipe: add a framework") names every file its greps find
_FRAMEWORK_GREPS = (re.compile(r"""['"](pytorch|mindspore)['"]"""),
                    re.compile(r"""['"](torch|mindspore)\.(Tensor|Parameter)|['"](torch|mindspore)\.['"]"""),
                    re.compile(r"_FRAMEWORKS"),
                    re.compile(r"""startswith\("torch\."\)|\(\?:torch\|mindspore"""))
_OWN = re.compile(r"^msprobe/(dumpers/(pytorch|mindspore)|pytorch|mindspore)/")


def framework_files() -> list:
    """The files outside the frameworks' own packages that the recipe's greps find (msprobe/, spec/check/)."""
    found = set()
    for path in sorted(list((ROOT / "msprobe").rglob("*.py")) + list((ROOT / "spec" / "check").glob("*.py"))):
        rel = str(path.relative_to(ROOT))
        if _OWN.match(rel):
            continue
        text = path.read_text(encoding="utf-8")
        if any(grep.search(text) for grep in _FRAMEWORK_GREPS):
            found.add(rel)
    return sorted(found)


def test_the_framework_recipe_names_every_file_its_greps_find():
    doc = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    recipe = doc[doc.index("### Recipe: add a framework"):doc.index("## Recipe: add a lake question")]
    files = framework_files()
    assert "msprobe/format/model.py" in files and "msprobe/readers/_tensor.py" in files, files
    missing = [f for f in files if f.removeprefix("msprobe/") not in recipe]
    assert not missing, f"the recipe 'add a framework' does not name {missing}"

"""Undefined names, unknown attributes and missing imports fixed without a model, and ruff's fixes."""

from __future__ import annotations

import pytest

from glm5_lsp.checks.providers import default_runner
from glm5_lsp.quickfix import QuickFixer, imports, names
from glm5_lsp.quickfix.edits import word_distance
from glm5_lsp.quickfix.names import attribute_problems, close_names

RUNNER = default_runner("python")


def fixes(code: str, path: str = "case.py"):
    names.warm(code, 30.0, imported_from=True)  # as batch does: the modules it imports names from listed
    return QuickFixer(RUNNER, path, "python", seconds=30.0, attribute_seconds=30.0).fixes(code)


@pytest.mark.parametrize("broken, fixed, title", [
    ("def f(obj):\n    return ojb\n", "def f(obj):\n    return obj\n", "Replace 'ojb' with 'obj'"),
    ("def f(items):\n    total = 0\n    for item in itmes:\n        total += item\n    return total + len(itmes)\n",
     "def f(items):\n    total = 0\n    for item in items:\n        total += item\n    return total + len(items)\n",
     "Replace 'itmes' with 'items'"),
    ("def f(nodes):\n    return [noe.value for node in nodes]\n", "def f(nodes):\n    return [node.value for node in nodes]\n",
     "Replace 'noe' with 'node'"),
    ("from json import JSONDecodeError\n\n\ndef f(x):\n    raise JSONDecodeErorr(x)\n",
     "from json import JSONDecodeError\n\n\ndef f(x):\n    raise JSONDecodeError(x)\n",
     "Replace 'JSONDecodeErorr' with 'JSONDecodeError'"),
    ("def f(x):\n    return lenn(x)\n", "def f(x):\n    return len(x)\n", "Replace 'lenn' with 'len'"),
    # a missing import, not a respelling: the name is right, nothing binds it
    ("def f(x):\n    return os.path.join(x)\n", "import os.path\ndef f(x):\n    return os.path.join(x)\n",
     "Add 'import os.path'"),
    ('"""Doc."""\nimport sys\n\n\ndef f():\n    return defaultdict(list, sys.argv)\n',
     '"""Doc."""\nimport sys\nfrom collections import defaultdict\n\n\ndef f():\n    return defaultdict(list, sys.argv)\n',
     "Add 'from collections import defaultdict'"),
    ("from math import inf\n\n\ndef f(x):\n    return x if x < inf else nan\n",
     "from math import inf, nan\n\n\ndef f(x):\n    return x if x < inf else nan\n", "Add 'from math import nan'"),
    ("def f(times):\n    return sorted(time)\n", "def f(times):\n    return sorted(times)\n", "Replace 'time' with 'times'"),
    # an attribute the module does not have, and one no method of the class sets
    ("import json\n\n\ndef f(x):\n    return json.lods(x)\n", "import json\n\n\ndef f(x):\n    return json.loads(x)\n",
     "Replace 'lods' with 'loads'"),
    ("import os.path\n\n\ndef f(p):\n    return os.path.joni(p, 'a')\n",
     "import os.path\n\n\ndef f(p):\n    return os.path.join(p, 'a')\n", "Replace 'joni' with 'join'"),
    ("import inspect\n\n\ndef f(g):\n    return inspect.cignature(g)\n",
     "import inspect\n\n\ndef f(g):\n    return inspect.signature(g)\n", "Replace 'cignature' with 'signature'"),
    ("class A:\n    def __init__(self):\n        self.value = 1\n\n    def get(self):\n        return self.valeu\n",
     "class A:\n    def __init__(self):\n        self.value = 1\n\n    def get(self):\n        return self.value\n",
     "Replace 'valeu' with 'value'"),
    # a method that does not take the receiver it uses
    ("class A:\n    def __init__(self, v):\n        self.v = v\n\n    def get():\n        return self.v\n",
     "class A:\n    def __init__(self, v):\n        self.v = v\n\n    def get(self):\n        return self.v\n",
     "Add 'self' as the first parameter of 'get'"),
    ("class A:\n    v = 1\n\n    async def add(other, *, scale=1):\n        return self.v + other * scale\n",
     "class A:\n    v = 1\n\n    async def add(self, other, *, scale=1):\n        return self.v + other * scale\n",
     "Add 'self' as the first parameter of 'add'"),
    ("class A:\n    @classmethod\n    def make():\n        return cls()\n",
     "class A:\n    @classmethod\n    def make(cls):\n        return cls()\n", "Add 'cls' as the first parameter of 'make'"),
    # an attribute of the instance used without its receiver, in that method only
    ("class A:\n    def __init__(self):\n        self.count = 0\n\n    def inc(self):\n        count += 1\n        return count\n",
     "class A:\n    def __init__(self):\n        self.count = 0\n\n    def inc(self):\n        self.count += 1\n        return self.count\n",
     "Replace 'count' with 'self.count'"),
    # a misspelled imported name, and the file's uses of it
    ("from collections import OrderedDict, defualtdict\n\nd = defualtdict(list)\ne = OrderedDict(d)\n",
     "from collections import OrderedDict, defaultdict\n\nd = defaultdict(list)\ne = OrderedDict(d)\n",
     "Replace 'defualtdict' with 'defaultdict'"),
    ("from collections import defualtdict as dd\n\nd = dd(list)\n", "from collections import defaultdict as dd\n\nd = dd(list)\n",
     "Replace 'defualtdict' with 'defaultdict'"),
    # another language's word for None
    ("def f(a):\n    if a is null:\n        return 0\n    return a\n", "def f(a):\n    if a is None:\n        return 0\n    return a\n",
     "Replace 'null' with 'None'"),
    # ruff's own fix
    ("import os\n\n\ndef f(x):\n    return x\n", "\n\ndef f(x):\n    return x\n", "Remove unused import: `os`"),
])
def test_names_are_fixed_by_the_name_meant(broken: str, fixed: str, title: str) -> None:
    found = fixes(broken)
    assert found and found[0].title == title, [f.title for f in found]
    assert found[0].text == fixed and found[0].clean()


def test_several_spellings_are_offered_and_the_nearest_preferred() -> None:
    found = fixes("def f(obj, job):\n    return ojb + job\n")
    titles = [f.title for f in found]
    assert set(titles) >= {"Replace 'ojb' with 'job'", "Replace 'ojb' with 'obj'"}
    assert sum(f.preferred for f in found) == 1 and found[0].preferred


def test_a_name_nothing_is_close_to_gets_no_fix() -> None:
    assert fixes("def f(x):\n    return undefined_a\n") == []


@pytest.mark.parametrize("code", [
    "def get():\n    return self.v\n",  # not a method
    "class A:\n    @staticmethod\n    def make():\n        return self\n",  # takes no receiver
    "class A:\n    @classmethod\n    def make():\n        return self\n",  # takes cls, not self
    "class A:\n    def get():\n        return cls\n",  # takes self, not cls
])
def test_a_receiver_is_added_only_where_the_method_takes_that_one(code: str) -> None:
    assert not any("first parameter" in f.title for f in fixes(code))


def test_an_attribute_is_reached_through_self_only_in_a_method_of_the_class_that_sets_it() -> None:
    code = ("class A:\n    def __init__(self):\n        self.count = 0\n\n    def inc(self):\n        return count\n\n\n"
            "def g():\n    return count\n")
    found = [f for f in fixes(code) if f.title == "Replace 'count' with 'self.count'"]
    assert len(found) == 1 and found[0].text.endswith("        return self.count\n\n\ndef g():\n    return count\n")
    assert not any("self.count" in f.title for f in fixes("def g():\n    return count\n"))
    assert not any("self." in f.title for f in fixes("class A:\n    def inc(self):\n        return count\n"))


def test_a_distance_counts_a_swap_as_one_edit() -> None:
    assert word_distance("ojb", "obj") == 1 and word_distance("abc", "abc") == 0
    assert word_distance("kitten", "sitting") == 3
    assert [name for _, name in close_names("valeu", {"value", "values", "other"})] == ["value"]  # 'values': two edits
    assert [name for _, name in close_names("JSONDecodeErorr", {"JSONDecodeError", "JSONDecoder"})] == ["JSONDecodeError"]
    assert close_names("ab", {"abc"}) == []  # two letters: only a different case


def test_attributes_are_judged_only_where_the_text_can_tell() -> None:
    listed = "from os import path, sep\nfrom json import JSONDecodeError\nfrom . import x\n"
    names.warm(listed, 30.0, imported_from=True)
    assert attribute_problems(listed, seconds=30.0) == []  # a submodule, names the modules have, a relative import
    assert attribute_problems("import json\njson.loads('1')\n", seconds=30.0) == []
    assert attribute_problems("import json\njson.__dict__\n", seconds=30.0) == []  # dunders: every module has them
    assert attribute_problems("import json\njson = 1\njson.nope\n", seconds=30.0) == []  # rebound
    dynamic = "class A:\n    def __getattr__(self, n):\n        return 1\n\n    def get(self):\n        return self.anything\n"
    assert attribute_problems(dynamic) == []
    assert [d.message for d in attribute_problems("import json\njson.lods('1')\n", seconds=30.0)] == [
        "module 'json' has no attribute 'lods'"]


def test_imports_come_from_the_standard_library_and_the_files_own_packages(tmp_path) -> None:
    def first(name: str, code: str) -> str:
        return imports.suggestions(name, code)[0].statement

    assert first("OrderedDict", "") == "from collections import OrderedDict"
    assert first("datetime", "datetime.now()") == "from datetime import datetime"
    assert first("datetime", "datetime.date(1, 2, 3)") == "import datetime"
    package = tmp_path / "proj"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "helpers.py").write_text("def helper():\n    return 1\n")
    (package / "a.py").write_text("from proj.helpers import helper\n")
    (package / "b.py").write_text("from proj.helpers import helper\n\n\ndef g():\n    return helper()\n")
    edited = str(package / "b.py")
    statements = [s.statement for s in imports.suggestions("helper", "def g():\n    return helper()\n", edited)]
    assert statements[0] == "from proj.helpers import helper"
    # The edited file's copy on disk is not evidence: it is being edited (here it imports the name).
    (package / "a.py").write_text("")
    imports._project_files.cache_clear()
    statements = [s.statement for s in imports.suggestions("helper", "def g():\n    return helper()\n", edited)]
    assert statements == ["from proj.helpers import helper"]  # the package still defines it
    (package / "helpers.py").write_text("")
    imports._project_files.cache_clear()
    assert imports.suggestions("helper", "def g():\n    return helper()\n", edited) == []


def test_a_module_the_file_imports_from_comes_before_the_habitprojects_habit(tmp_path, monkeypatch) -> None:
    # The package's files import ``reject`` from where it is defined; this file imports from the
    # package itself, which exports it: adding it there is what the file's author would write.
    package = tmp_path / "habitproj"
    package.mkdir()
    (package / "__init__.py").write_text('from habitproj.control import reject\n__all__ = ["reject", "strategies"]\n')
    (package / "control.py").write_text("def reject():\n    return 1\n")
    (package / "strategies.py").write_text("")
    (package / "a.py").write_text("from habitproj.control import reject\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    caches = (imports.find_module, imports._module_names, imports._project_files)
    for cache in caches:  # a module looked up before this folder was on the path
        cache.cache_clear()
    code = "from habitproj import strategies\n\n\ndef g():\n    return reject(strategies)\n"
    statements = [s.statement for s in imports.suggestions("reject", code, str(package / "b.py"))]
    for cache in caches:  # nor the folder's modules after it
        cache.cache_clear()
    assert statements[:2] == ["from habitproj import reject", "from habitproj.control import reject"]


def test_a_new_import_goes_after_the_docstring_and_the_other_imports() -> None:
    code = '"""Doc."""\nfrom __future__ import annotations\n\nfrom os import (\n    path)\n# note\n\nx = 1\n'
    suggestion = imports.Suggestion("re", "", "import re", True)
    edit = imports.import_edit(code, suggestion)
    assert code[:edit.start] + edit.text + code[edit.end:] == \
        '"""Doc."""\nfrom __future__ import annotations\n\nfrom os import (\n    path)\nimport re\n# note\n\nx = 1\n'


def test_an_unused_import_ruff_will_not_remove_is_offered_as_an_unsafe_fix(tmp_path) -> None:
    """In ``__init__.py`` ruff offers no fix for ``F401`` (an import there may be a re-export)."""
    path = str(tmp_path / "__init__.py")
    found = fixes("import os, sys\nfrom json import dumps, loads\n\n\ndef f(x):\n    return loads(x), os\n", path)
    assert found[0].steps == ("Remove unused import: `sys`", "Remove unused import: `json.dumps`")
    assert found[0].text == "import os\nfrom json import loads\n\n\ndef f(x):\n    return loads(x), os\n"
    assert not found[0].safe and found[0].clean()
    plain = fixes("import os\n\n\ndef f(x):\n    return x\n", str(tmp_path / "mod.py"))
    assert plain[0].safe and plain[0].source == "ruff"  # elsewhere ruff's own (safe) fix

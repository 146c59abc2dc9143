"""show_source: an object's source, or a named one's read from its file without importing it."""
from __future__ import annotations

import inspect
import subprocess
import sys

import pytest

from course_lib.composition import compose, layout
from course_lib.display import _named_source, show_source


@pytest.mark.parametrize("obj, name", [
    (compose.build_2d, "course_lib.composition.compose.build_2d"),
    (compose.data_parallel, "course_lib.composition.compose.data_parallel"),
    (layout.Layout, "course_lib.composition.layout.Layout"),
    (layout.Layout.parse, "course_lib.composition.layout.Layout.parse"),
])
def test_a_named_object_shows_the_lines_inspect_reads(obj, name):
    qualname, where, lines = _named_source(name)
    assert lines == inspect.getsourcelines(obj)[0]
    assert qualname == obj.__qualname__ and where == inspect.getsourcefile(obj)


def test_named_and_imported_show_the_same_html():
    assert (show_source("course_lib.composition.compose.build_2d").data
            == show_source(compose.build_2d).data)


@pytest.mark.parametrize("name, message", [
    ("course_lib.composition.compose.no_such_thing", "defines no no_such_thing"),
    ("course_lib.no_such_module.f", "no Python module or package"),
    ("course_lib.composition", "names a package"),
])
def test_a_wrong_name_says_what_is_wrong(name, message):
    with pytest.raises(ValueError, match=message):
        _named_source(name)


def test_showing_by_name_imports_neither_the_module_nor_fsdp():
    code = ("import sys\nfrom course_lib.display import show_source\n"
            "show_source('course_lib.composition.compose.build_2d', "
            "'course_lib.tensor_parallel.layers.dtensor_block')\n"
            "print(sorted(m for m in ('course_lib.composition.compose', 'torch.distributed.fsdp', "
            "'torch.distributed.tensor') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout

"""Every Python here pickles DCP's Enum member in a form the safe loader reads (issue 57).

``TensorProperties`` in DCP's ``.metadata`` holds a ``_MEM_FORMAT_ENCODING`` member; how a member
is pickled depends on the interpreter (Debian's 3.11.2 by name, ``getattr(cls, "NAME")``; 3.11.7,
3.10, 3.12, 3.13 by value). Torch is installed for one Python here, so each other interpreter
pickles the members of a stand-in class with the same module, name and members (a pickle names
only those, so the bytes are what DCP's ``.metadata`` holds there), with its default protocol, as
DCP's ``pickle.dump`` does; the course's loader, here, must read them back as torch's members.
``COURSE_PYTHONS`` (``os.pathsep``-separated; ``.ci/other-pythons`` sets it) names the other
interpreters; this one is always checked.
"""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import pytest
from torch.distributed.checkpoint.metadata import _MEM_FORMAT_ENCODING

from course_lib.fault_tolerance.metadata_check import MetadataUnpickler

PYTHONS = [sys.executable, *filter(None, os.environ.get("COURSE_PYTHONS", "").split(os.pathsep))]

# stdlib only: the stand-in modules and class, then the members pickled as DCP would
WRITER = """
import enum, json, pickle, sys, types
module, qualname, members = json.loads(sys.argv[1])
parts = module.split(".")
for i in range(1, len(parts) + 1):
    sys.modules[".".join(parts[:i])] = types.ModuleType(".".join(parts[:i]))
cls = enum.Enum(qualname, members, module=module, qualname=qualname)
setattr(sys.modules[module], qualname, cls)
sys.stdout.buffer.write(pickle.dumps(list(cls), protocol=pickle.DEFAULT_PROTOCOL))
"""


@pytest.mark.parametrize("python", PYTHONS)
def test_the_members_this_python_pickles_load_through_the_safe_loader(python):
    spec = [_MEM_FORMAT_ENCODING.__module__, _MEM_FORMAT_ENCODING.__qualname__,
            [[m.name, m.value] for m in _MEM_FORMAT_ENCODING]]
    done = subprocess.run([python, "-I", "-c", WRITER, json.dumps(spec)], capture_output=True,
                          timeout=60, check=True)
    version = subprocess.run([python, "-I", "-c", "import sys; print(sys.version.split()[0])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    form = "by name (getattr)" if b"getattr" in done.stdout else "by value"
    print(f"Python {version} ({python}) pickles an Enum member {form}")
    loaded = MetadataUnpickler(io.BytesIO(done.stdout)).load()
    assert len(loaded) == len(_MEM_FORMAT_ENCODING)
    assert all(a is b for a, b in zip(loaded, _MEM_FORMAT_ENCODING)), (version, loaded)

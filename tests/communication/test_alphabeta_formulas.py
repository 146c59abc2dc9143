"""The α-β formulas import no launcher (issue 51); the chapter-5 path hands on the same objects."""
from __future__ import annotations

import subprocess
import sys

from course_lib.communication import alphabeta, formulas


def test_formulas_import_no_launcher():
    code = ("import sys, course_lib.communication.formulas as f; "
            "print(sorted(m for m in sys.modules if m.startswith('course_lib.launcher')"
            " or m == 'course_lib.communication.benchmark'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_old_path_is_the_same_formulas():
    for name in formulas.__all__:
        assert getattr(alphabeta, name) is getattr(formulas, name), name
    fit = formulas.fit_alpha_beta([(2, 1e3, 2e-5 + 1e3 * 1e-9), (2, 1e6, 2e-5 + 1e6 * 1e-9)])
    assert abs(fit.alpha - 1e-5) < 1e-9 and abs(fit.beta - 1e-9) < 1e-12

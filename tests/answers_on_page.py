"""What a program can see of an exercise's answer on the page above it (issue 60, item 1).

The exercises are found by ``exercise_cells.find_exercises`` (their one home). For each one,
:func:`reveals` lists what gives its answer away, each finding one short line:

* **number** — a stored output, markdown cell or code cell above the exercise (or the exercise
  cell itself: its comments and hint) shows the number its solution gives, written as digits
  (``33554432``, ``33,554,432``), rounded to what is shown (``0.273``, ``27.3 %``) or scaled to
  a unit (``33.6 MB``, ``32 MiB``, ``30.98 min`` is the number itself). Numbers with fewer than
  three significant digits are not looked for (they appear in any text). The solution's numbers
  come from running it: statically when it needs no notebook state (``answer = 3 * 4 * 1024``),
  else in the notebook's kernel during nbval (``tests/nbval_exercises.py`` passes them in);
* **formula** — the check's hint states an arithmetic formula (``b*s*h``, ``2(p-1)/p``,
  ``√(2·C·M)``); the check call computes its expected value in plain sight from the exercise's
  own inputs (``check_number(answer, 1.0 / (1.0 / 8 + ...))``, ``bubble_formula(4, 8)``); or
  text above contains one of the forms the cell's ``exercise_answer_forms`` metadata lists, or the
  solution's own expression;
* **function** — another code cell defines a function or class with the name the stub asks for,
  or with the solution's body; or markdown / a stored output above shows ``def <name>(``;
* **order** — the exercise sits in numbered section k and a code cell above it belongs to a
  numbered section after k (a later section's output sits above it).
"""
from __future__ import annotations

import ast
import math
import re

from exercise_cells import Exercise, _source, stubs

_NUMBER = re.compile(r"(?<![\w.])(\d{1,3}(?:,\d{3})+|\d+)(\.\d+)?(?:\s*(%|[kKMGT]i?B\b|min\b|ms\b|h\b|s\b))?")
_SCALE = {"%": 1e-2, "kB": 1e3, "KB": 1e3, "KiB": 2**10, "MB": 1e6, "MiB": 2**20, "GB": 1e9,
          "GiB": 2**30, "TB": 1e12, "TiB": 2**40}
_FORMULA = re.compile(r"[\w)]\s*[*·×]\s*[\w(]|√|\s/\s|[\d)]/|/[\d(]|"
                      r"\b[a-zA-Z]\s*[+−-]\s*[a-zA-Z]\s*[+−-]\s*\d")
_LAUNCHERS = {"run", "torchrun"}  # a run on N ranks is the experiment, not a formula


def _outputs(cell: dict) -> str:
    texts = []
    for out in cell.get("outputs", []):
        if "text" in out:
            texts.append("".join(out["text"]) if isinstance(out["text"], list) else out["text"])
        for key in ("text/plain", "text/html", "text/markdown"):
            data = out.get("data", {}).get(key, "")
            texts.append("".join(data) if isinstance(data, list) else data)
    return "\n".join(texts)


def page_above(cells: list[dict], exercise: Exercise) -> list[tuple[str, str]]:
    """(where, text) of everything a learner sees before answering: cells above, the cell itself."""
    page = []
    for j, cell in enumerate(cells[:exercise.cell + 1]):
        if cell["cell_type"] == "markdown":
            page.append((f"markdown cell {j}", _source(cell)))
        elif cell["cell_type"] == "code":
            page.append((f"code cell {j}", _source(cell)))
            page.append((f"stored output of cell {j}", _outputs(cell)))
    return page


def static_numbers(exercise: Exercise) -> list[float]:
    """The solution's numeric answers when it runs without the notebook (else none)."""
    values, _ = stubs(exercise.source)
    namespace = {"__builtins__": {"abs": abs, "min": min, "max": max, "round": round, "int": int,
                                  "float": float, "sum": sum, "len": len, "range": range,
                                  "__import__": lambda name, *a, **k: math if name == "math"
                                  else (_ for _ in ()).throw(ImportError(name))}}
    try:
        exec(compile(exercise.solution, "<solution>", "exec"), namespace)  # the course's own text
    except Exception:  # noqa: BLE001 - needs the notebook's state: nbval supplies the numbers
        return []
    found = [namespace.get(name) for name in values]
    return [v for v in found if isinstance(v, (int, float)) and not isinstance(v, bool)]


def _significant(digits: str) -> int:
    return len(digits.replace(",", "").replace(".", "").lstrip("0"))


def shows_number(text: str, value: float) -> str | None:
    """The token in ``text`` that shows ``value`` (as written, rounded or scaled), else None."""
    if not value or not math.isfinite(value):
        return None
    for m in _NUMBER.finditer(text):
        whole, frac, unit = m.group(1), m.group(2) or "", m.group(3) or ""
        if _significant(whole + frac) < 3 or (value == int(value) and abs(value) < 100):
            continue
        shown = float(whole.replace(",", "") + frac)
        half = 0.5 * 10.0 ** -(len(frac) - 1 if frac else 0)
        candidates = [value, abs(value)]
        if unit in _SCALE and (unit != "%" or value != int(value)):
            candidates += [value / _SCALE[unit], abs(value) / _SCALE[unit]]
        if any(abs(shown - c) <= half * (1 + 1e-9) and (frac or c == int(c)) for c in candidates):
            return m.group(0)
    return None


def _norm(text: str) -> str:
    text = text.replace("−", "-").replace("·", "*").replace("×", "*").replace("`", "").lower()
    return re.sub(r"[\s*\\]", "", text)


def _check_calls(source: str) -> list[ast.Call]:
    return [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Call)
            and isinstance(n.func, ast.Name) and n.func.id.startswith("check_")]


def _computed_in_sight(source: str) -> list[str]:
    """Expected values a check call computes in sight from the exercise's inputs: arithmetic,
    or a function fed with the exercise's numbers."""
    found = []
    for call in _check_calls(source):
        if call.func.id not in ("check_number", "check_close", "check_choice") or len(call.args) < 2:
            continue
        expected = call.args[1]
        nodes = list(ast.walk(expected))
        arithmetic = any(isinstance(n, ast.BinOp) for n in nodes)
        fed = any(isinstance(n, ast.Call) and getattr(n.func, "id", None) not in _LAUNCHERS and any(isinstance(a, ast.Constant) and
                  isinstance(a.value, (int, float)) for a in list(n.args) +
                  [k.value for k in n.keywords]) for n in nodes)
        if arithmetic or fed:
            found.append(ast.unparse(expected))
    return found


def _hints(source: str) -> list[str]:
    return [k.value.value for call in _check_calls(source) for k in call.keywords
            if k.arg == "hint" and isinstance(k.value, ast.Constant) and isinstance(k.value.value, str)]


def _function_bodies(source: str) -> dict[str, str]:
    """name -> the dump of its body without a docstring, for every def/class in ``source``."""
    try:
        tree = ast.parse(source)
    except SyntaxError:  # a cell with magics
        return {}
    out = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            body = node.body[1:] if (node.body and isinstance(node.body[0], ast.Expr) and
                                     isinstance(node.body[0].value, ast.Constant)) else node.body
            out[node.name] = ast.dump(ast.Module(body=body, type_ignores=[]))
    return out


def _strip_magics(source: str) -> str:
    return "\n".join("" if line.lstrip().startswith(("%", "!")) else line
                     for line in source.splitlines())


_SECTION = re.compile(r"^#{2,3}\s*(\d+)\s*[.·:)]", re.M)


def _sections(cells: list[dict]) -> list[int | None]:
    current, out = None, []
    for cell in cells:
        if cell["cell_type"] == "markdown":
            heads = _SECTION.findall(_source(cell))
            if heads:
                current = int(heads[-1])
        out.append(current)
    return out


def reveals(cells: list[dict], exercise: Exercise, numbers: list[float] = ()) -> list[str]:
    """Every way the page above ``exercise`` (and the cell itself) gives its answer away."""
    findings = []
    page = page_above(cells, exercise)
    for value in list(numbers) + static_numbers(exercise):
        for where, text in page:
            token = shows_number(text, value)
            if token:
                findings.append(f"number: {where} shows {token!r}, the answer ({value:.6g})")
                break
    for hint in _hints(exercise.source):
        if _FORMULA.search(hint):
            findings.append(f"formula: the hint states it ({hint!r})")
    for expression in _computed_in_sight(exercise.source):
        findings.append(f"formula: the check computes the answer in sight ({expression})")
    forms = list(exercise.forms)
    for node in ast.parse(exercise.solution).body:
        if isinstance(node, ast.Assign) and any(isinstance(n, ast.Name) for n in ast.walk(node.value)):
            forms.append(ast.unparse(node.value))
    for form in forms:
        if len(_norm(form)) < 6:
            continue
        where = next((w for w, text in page if w != f"code cell {exercise.cell}"
                      and _norm(form) in _norm(text)), None)
        if where:
            findings.append(f"formula: {where} writes {form!r}")
    _, functions = stubs(exercise.source)
    solved = _function_bodies(exercise.solution)
    for j, cell in enumerate(cells):
        if cell["cell_type"] != "code" or j == exercise.cell:
            continue
        for name, body in _function_bodies(_strip_magics(_source(cell))).items():
            if name in functions:
                findings.append(f"function: code cell {j} defines {name}")
            elif body in solved.values():
                findings.append(f"function: code cell {j} defines {name} with the solution's body")
    for name in functions:
        where = next((w for w, text in page if not w.startswith("code cell")
                      and re.search(rf"\b(def|class) {name}\b", text)), None)
        if where:
            findings.append(f"function: {where} shows `def {name}`")
    sections = _sections(cells)
    mine = sections[exercise.cell]
    if mine is not None:
        later = [j for j in range(exercise.cell) if cells[j]["cell_type"] == "code"
                 and sections[j] is not None and sections[j] > mine]
        if later:
            findings.append(f"order: code cell {later[0]} of section {sections[later[0]]} sits above "
                            f"this exercise of section {mine}")
    return list(dict.fromkeys(findings))

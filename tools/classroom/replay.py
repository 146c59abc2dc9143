"""Record what a learner's answer produced (in the sandbox); replay it where no learner code runs.

In the sandbox each name the exercise asks for is replaced, before the published check runs, by
:func:`record`: a value is saved as it is; a function by a :class:`Recorded` wrapper that, at
every call (in the kernel or on a rank), saves what it returned, what it changed in the tensors it
was given (values, ``.grad``; a module's parameters and buffers, an optimizer's parameters count)
and, where it was called on tensors that require grad, the gradients its backward passed on.
Saved as ``torch.save`` files of plain data (tensors, numbers, strings, lists, tuples, dicts): a
tensor it returned that *is* one it was given is saved as a reference to that input.

The grader's clean kernel runs the published check with :class:`Replayed` (and the loaded values)
in place of the learner's names: each call, in the same order on the same rank, returns what was
recorded and applies the same changes, read with ``torch.load(weights_only=True)``. The verdict
and every expected value come from that kernel: nothing the learner's code patched in its own
interpreter is there. Not replayable: a class the learner writes (its methods run inside torch's
hooks); such an exercise is checked inside the sandbox (see docs/teaching.md).
"""
from __future__ import annotations

import builtins
import io
import os
from pathlib import PurePath
from typing import Any

import torch

INPUT, PATH, OPAQUE, UNDER = "__course_input__", "__course_path__", "__course_opaque__", \
    "__course_under__"
ELLIPSIS = ("__course_ellipsis__",)   # `...`, the stub's "not answered yet"
MAX_RECORD = 64 << 20  # bytes one call's record may take when read back


def _where() -> str:
    import torch.distributed as dist
    return f"rank{dist.get_rank()}" if dist.is_available() and dist.is_initialized() else "main"


def _inputs(value: Any, found: dict | None = None, depth: int = 0) -> list[torch.Tensor]:
    """Every tensor reachable from a call's arguments, in a fixed order, each once."""
    found = {} if found is None else found
    if depth > 20:
        return list(found.values())
    if isinstance(value, torch.Tensor):
        found.setdefault(id(value), value)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _inputs(v, found, depth + 1)
    elif isinstance(value, dict):
        for v in value.values():
            _inputs(v, found, depth + 1)
    elif isinstance(value, torch.nn.Module):
        for t in [*value.parameters(), *value.buffers()]:
            found.setdefault(id(t), t)
    elif isinstance(value, torch.optim.Optimizer):
        for group in value.param_groups:
            _inputs(group["params"], found, depth + 1)
    return list(found.values())


def _paths(args: tuple, kwargs: dict) -> list[str]:
    """The arguments that are paths (a folder the check made, e.g. a copy in a temp folder)."""
    return [str(a) if isinstance(a, (str, PurePath)) else "" for a in [*args, *kwargs.values()]]


def _under(value: str, paths: list[str]) -> tuple | None:
    """``value`` as (argument index, the rest) if it is one of the path arguments or below it."""
    for i, p in sorted(enumerate(paths), key=lambda x: -len(x[1])):
        if p and (value == p or value.startswith(p.rstrip("/") + "/")):
            return i, value[len(p):].lstrip("/")
    return None


def _encode(value: Any, ids: dict[int, int], depth: int = 0, paths: list[str] = ()) -> Any:
    if isinstance(value, (str, PurePath)) and paths:
        under = _under(str(value), list(paths))
        if under is not None:   # replayed below the clean check's own folder
            return (UNDER, under[0], under[1], isinstance(value, PurePath))
    if depth > 30:
        return (OPAQUE, "something nested too deeply")
    if isinstance(value, torch.Tensor):
        if id(value) in ids:
            return (INPUT, ids[id(value)])
        return value.detach().clone() if not value.is_meta else (OPAQUE, "meta tensor")
    if value is None or isinstance(value, (bool, int, float, str, bytes)):
        return value
    if value is Ellipsis:
        return ELLIPSIS
    if isinstance(value, (torch.dtype, torch.Size)):
        return value
    if isinstance(value, PurePath):
        return (PATH, str(value))
    if isinstance(value, (list, tuple)):
        return type(value)(_encode(v, ids, depth + 1, paths) for v in value) \
            if type(value) in (list, tuple) else tuple(_encode(v, ids, depth + 1, paths)
                                                       for v in value)
    if isinstance(value, dict):
        return {k: _encode(v, ids, depth + 1, paths) for k, v in value.items()
                if isinstance(k, (str, int, float, bool, tuple))}
    if type(value).__module__ == "numpy" and getattr(value, "ndim", 1) == 0:
        return value.item()
    return (OPAQUE, type(value).__name__)


class Opaque:
    """What the replay returns for a value that could not be recorded (a learner's object)."""

    def __init__(self, what: str) -> None:
        self.what = what

    def __repr__(self) -> str:
        return f"<a {self.what}>"


def _decode(value: Any, inputs: list[torch.Tensor], paths: list[str] = ()) -> Any:
    if isinstance(value, tuple) and value == ELLIPSIS:
        return Ellipsis
    if isinstance(value, tuple) and len(value) == 4 and value[0] == UNDER and \
            isinstance(value[1], int) and 0 <= value[1] < len(paths) and paths[value[1]]:
        from pathlib import Path
        joined = Path(paths[value[1]]) / str(value[2]) if value[2] else Path(paths[value[1]])
        return joined if value[3] else str(joined) if value[2] else paths[value[1]]
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], str):
        if value[0] == INPUT and isinstance(value[1], int) and 0 <= value[1] < len(inputs):
            return inputs[value[1]]
        if value[0] == PATH:
            from pathlib import Path
            return Path(str(value[1]))
        if value[0] == OPAQUE:
            return Opaque(str(value[1]))
    if isinstance(value, (list, tuple)):
        return type(value)(_decode(v, inputs, paths) for v in value)
    if isinstance(value, dict):
        return {k: _decode(v, inputs, paths) for k, v in value.items()}
    return value


def _snapshot(tensors: list[torch.Tensor]) -> list:
    return [None if t.is_meta else (t.detach().clone(), _grad(t)) for t in tensors]


def _grad(t: torch.Tensor) -> torch.Tensor | None:
    """A leaf's ``.grad`` (a non-leaf has none to read or change)."""
    return t.grad.detach().clone() if t.is_leaf and t.grad is not None else None


def _changes(tensors: list[torch.Tensor], before: list) -> dict:
    effects = {}
    for i, (t, was) in enumerate(zip(tensors, before)):
        if was is None:
            continue
        data, grad = was
        change = {}
        if t.shape != data.shape or not torch.equal(t.detach(), data):
            change["data"] = t.detach().clone()
        now = _grad(t)
        if (now is None) != (grad is None) or (now is not None and (
                now.shape != grad.shape or not torch.equal(now, grad))):
            change["grad"] = None if now is None else now.detach().clone()
        if change:
            effects[i] = change
    return effects


def _save(folder: str, key: str, record: dict) -> None:
    n = 0
    while True:
        path = os.path.join(folder, f"{key}.{n:05d}.pt")
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            break
        except FileExistsError:
            n += 1
    buffer = io.BytesIO()
    torch.save(record, buffer)
    try:   # what the clean kernel could not read back becomes an opaque value now
        buffer.seek(0)
        torch.load(buffer, weights_only=True)
    except Exception:  # noqa: BLE001 - a type weights_only refuses (a set, a class, ...)
        buffer = io.BytesIO()
        torch.save({**record, "out": (OPAQUE, f"{type(record.get('out')).__name__} "
                                              "(not plain data)")}, buffer)
    with os.fdopen(fd, "wb") as f:
        f.write(buffer.getvalue())


def _load(folder: str, key: str) -> dict:
    """The next record of ``key`` (the count of those already read kept in a file beside them)."""
    counter = os.path.join(folder, f".{key}.used")
    try:
        n = int(open(counter).read() or 0)
    except FileNotFoundError:
        n = 0
    with open(counter, "w") as f:
        f.write(str(n + 1))
    path = os.path.join(folder, f"{key}.{n:05d}.pt")
    if not os.path.isfile(path) and key.endswith(".value"):
        raise RuntimeError(f"no value of {key[:-6]} was recorded in your sandbox")
    if not os.path.isfile(path):
        raise RuntimeError(f"your answer was not called this way in your sandbox (no call "
                           f"{n + 1} of {key.split('.')[0]} on {key.split('.')[1]} was recorded)")
    if os.path.getsize(path) > MAX_RECORD:
        raise RuntimeError(f"what your answer returned is over {MAX_RECORD >> 20} MiB")
    record = torch.load(path, weights_only=True)
    if not isinstance(record, dict):
        raise RuntimeError("a malformed record")
    return record


class _Tap(torch.autograd.Function):
    """Forward: the learner's output; backward: the learner's backward, its gradients recorded."""

    @staticmethod
    def forward(ctx, recorded, key, xs, out, *inputs):
        ctx.recorded, ctx.key, ctx.xs, ctx.out = recorded, key, xs, out[0]
        return out[0].detach().clone()

    @staticmethod
    def backward(ctx, grad):
        grads = torch.autograd.grad(ctx.out, ctx.xs, grad, allow_unused=True)
        _save(ctx.recorded.folder, ctx.key + "-backward",
              {"grads": [None if g is None else g.detach().clone() for g in grads]})
        return (None, None, None, None, *grads)


class _ReplayTap(torch.autograd.Function):
    @staticmethod
    def forward(ctx, replayed, key, out, *inputs):
        ctx.replayed, ctx.key, ctx.shapes = replayed, key, [x.shape for x in inputs]
        return out[0].clone()

    @staticmethod
    def backward(ctx, grad):
        grads = _load(ctx.replayed.folder, ctx.key + "-backward").get("grads")
        if not isinstance(grads, list) or len(grads) != len(ctx.shapes) or any(
                g is not None and (not isinstance(g, torch.Tensor) or g.shape != s)
                for g, s in zip(grads, ctx.shapes)):
            raise RuntimeError("the gradients your function passed back have other shapes")
        return (None, None, None, *grads)


def _differentiable(args: tuple) -> list[int]:
    if not torch.is_grad_enabled():
        return []
    return [i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.requires_grad]


class Recorded:
    """The learner's function, recording each call (in the sandbox)."""

    def __init__(self, fn, name: str, folder: str) -> None:
        self.fn, self.name, self.folder = fn, name, folder

    def __call__(self, *args, **kwargs):
        key = f"{self.name}.{_where()}"
        tensors = _inputs((args, kwargs))
        before = _snapshot(tensors)
        diff = _differentiable(args)
        called = list(args)
        for i in diff:
            called[i] = args[i].detach().requires_grad_()
        try:
            out = self.fn(*called, **kwargs)
        except Exception as err:
            _save(self.folder, key, {"raised": [type(err).__name__, str(err)[:500]]})
            raise
        tap = bool(diff) and isinstance(out, torch.Tensor) and out.grad_fn is not None
        ids = {id(t): i for i, t in enumerate(tensors)}
        _save(self.folder, key, {"out": _encode(out, ids, 0, _paths(args, kwargs)),
                                 "effects": _changes(tensors, before),
                                 "tapped": tap})
        if tap:
            return _Tap.apply(self, key, [called[i] for i in diff], [out],
                              *[args[i] for i in diff])
        return out


class Replayed:
    """In the grader's clean kernel: each call returns and changes what the learner's did."""

    def __init__(self, name: str, folder: str) -> None:
        self.name, self.folder = name, folder

    def __call__(self, *args, **kwargs):
        key = f"{self.name}.{_where()}"
        record = _load(self.folder, key)
        if "raised" in record:
            kind, message = (list(record["raised"]) + ["", ""])[:2]
            cls = getattr(builtins, str(kind), None)
            if not (isinstance(cls, type) and issubclass(cls, Exception)):
                cls = RuntimeError
            raise cls(str(message))
        tensors = _inputs((args, kwargs))
        effects = record.get("effects") or {}
        for i, change in effects.items():
            if not (isinstance(i, int) and 0 <= i < len(tensors) and isinstance(change, dict)):
                raise RuntimeError("a malformed record")
            t = tensors[i]
            if isinstance(change.get("data"), torch.Tensor):
                if change["data"].shape != t.shape:
                    raise RuntimeError("your function changed the shape of a tensor in place")
                with torch.no_grad():
                    t.copy_(change["data"])
            if "grad" in change and t.is_leaf:
                t.grad = change["grad"]
        out = _decode(record.get("out"), tensors, _paths(args, kwargs))
        diff = _differentiable(args)
        if record.get("tapped") and diff and isinstance(out, torch.Tensor):
            return _ReplayTap.apply(self, key, [out], *[args[i] for i in diff])
        return out


def record(value: Any, name: str, folder: str, function: bool) -> Any:
    """In the sandbox: a function answer (``function``, from the published stub) wrapped in
    :class:`Recorded`; a value saved now."""
    if function:
        return Recorded(value, name, folder)
    _save(folder, f"{name}.value", {"out": _encode(value, {})})
    return value


def replay(name: str, folder: str, function: bool) -> Any:
    """In the clean kernel: what the learner's ``name`` was (a function: :class:`Replayed`)."""
    if function:
        return Replayed(name, folder)
    record_ = _load(folder, f"{name}.value")
    return _decode(record_.get("out"), [])

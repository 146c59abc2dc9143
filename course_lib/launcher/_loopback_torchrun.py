"""``python -m course_lib.launcher._loopback_torchrun ARGS`` = ``torchrun ARGS``, stores on loopback only.

torchrun's agent hosts two TCPStores (the c10d rendezvous store and the store its workers join)
and ``TCPStore`` always listens on every interface (``*:port``), even with a loopback endpoint
and ``--local-addr=127.0.0.1``; those stores have no authentication. ``TCPStore`` can instead
serve on a socket it is handed (``master_listen_fd``). For one-machine runs
:func:`course_lib.torchrun` starts torchrun through this module, which hands every store the
agent hosts on 127.0.0.1/localhost a socket bound to 127.0.0.1, then runs torchrun unchanged,
and ends the agent with ``os._exit`` once torchrun returned (no interpreter teardown).
"""
from __future__ import annotations

import os
import runpy
import socket
import sys
import traceback

import torch.distributed as dist
from torch.distributed.elastic.rendezvous import c10d_rendezvous_backend

from course_lib.launcher import _forked_workers

_LOCAL = ("127.0.0.1", "localhost")


class LoopbackTCPStore(dist.TCPStore):
    """A ``TCPStore`` whose server, on a loopback host, listens on 127.0.0.1 only."""

    def __init__(self, host_name, port, *args, **kwargs):
        is_master = kwargs.get("is_master", args[1] if len(args) > 1 else False)
        if is_master and host_name in _LOCAL and kwargs.get("master_listen_fd") is None:
            sock = socket.create_server(("127.0.0.1", port), backlog=512)  # SO_REUSEADDR set
            port = sock.getsockname()[1]
            kwargs["master_listen_fd"] = sock.detach()  # the store serves on it from now on
        super().__init__(host_name, port, *args, **kwargs)


def _main() -> int:
    """torchrun's ``main``; its exit status. An error prints as an uncaught one would."""
    dist.TCPStore = c10d_rendezvous_backend.TCPStore = LoopbackTCPStore
    if os.environ.get("COURSE_TORCHRUN_WORKERS") == "fork":  # the launcher's choice (issue 50)
        _forked_workers.install()
    sys.argv[0] = "torchrun"
    try:
        runpy.run_module("torch.distributed.run", run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return 1
    except BaseException:  # noqa: BLE001 — torchrun's summary ("Root Cause ...") is in it
        traceback.print_exc()
        return 1
    return 0


if __name__ == "__main__":
    # the agent is done (its workers are gone, its rendezvous closed): flush and leave without
    # the interpreter's teardown of torch, which took ~1-5 s of CPU after every run here
    code = _main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)

"""The rendezvous port, checked before torchrun starts (`fp8launch run`'s preflight). torchrun's c10d rendezvous hosts
its store on the endpoint's port when the endpoint names this machine; when another program holds that port, torchrun
connects to that program instead, takes it for the store and waits for a reply that never comes (measured: until the
program let go, 208 s, then a traceback). So:

- one node and no endpoint set: torchrun.sh runs --standalone, on a free port of its own: nothing to check;
- the endpoint names this machine (as torch decides it: localhost, a loopback address, this host's name or one of its
  addresses): its port must be free to bind, or held by a torchrun agent of this same job (another node's agent on this
  machine, as two agents on loopback are); else refused at once (exit 3), naming the port, the key it came from, and the
  program holding it where /proc shows it;
- the endpoint names another machine that accepts the connection: a c10d client (torch's, in a subprocess: the store's
  protocol is torch's own) must get its answer within PROBE_S, else refused the same way. Nothing listening there yet
  is no error: node 0 may start later, and torchrun waits for it (its failure then is one line too: failure.py).
"""

from __future__ import annotations

import errno
import ipaddress
import os
import socket
import subprocess
import sys
from typing import Mapping

from launcher.errors import EnvironmentProblem, with_fix
from launcher.planning.plan import Plan

PROBE_S = 30.0
"""How long the probe of another machine's store may take, torch's import in the subprocess included (2-6 s here)."""
CONNECT_S = 3.0


def endpoint(plan: Plan, launch_env: Mapping[str, str], environ: Mapping[str, str]) -> tuple[str, str] | None:
    """(HOST:PORT, the key it came from) as torchrun.sh will use it, or None for --standalone."""
    if launch_env.get("RDZV_ENDPOINT"):
        return launch_env["RDZV_ENDPOINT"], "--rdzv-endpoint"
    if environ.get("RDZV_ENDPOINT"):
        return environ["RDZV_ENDPOINT"], "RDZV_ENDPOINT"
    if plan.distributed.nodes == 1:
        return None
    return plan.launch.rdzv_endpoint, "launch.rdzv_endpoint"


def check(plan: Plan, launch_env: Mapping[str, str], environ: Mapping[str, str] | None = None) -> None:
    """Raise EnvironmentProblem (exit 3) when the rendezvous endpoint's port is held by a program that is not this job's."""
    environ = os.environ if environ is None else environ
    found = endpoint(plan, launch_env, environ)
    if found is None:
        return
    where, key = found
    host, _, port_text = where.rpartition(":")
    host, port = host.strip("[]"), int(port_text)
    rdzv_id = launch_env.get("RDZV_ID") or environ.get("RDZV_ID") or plan.name
    fix = "stop that program, or give every node a free port: " + {
        "--rdzv-endpoint": "--rdzv-endpoint HOST:PORT (or launch.rdzv_endpoint)",
        "RDZV_ENDPOINT": "RDZV_ENDPOINT=HOST:PORT (or launch.rdzv_endpoint)"}.get(key, 'launch.rdzv_endpoint = "HOST:PORT"')
    if hosted_here(host):
        if bindable(port):
            return
        pid, command = holder(port)
        if pid is not None and same_job(command, rdzv_id):
            return
        who = f"pid {pid}: {' '.join(command)[:120]}" if pid is not None else "a process this user cannot see"
        raise EnvironmentProblem(with_fix(
            f"the rendezvous port {port} ({key} = {where}) is held by another program on this machine ({who}); torchrun "
            "would take it for its store and wait for an answer that never comes", fix))
    if answers_tcp(host, port) and not answers_as_store(host, port):
        raise EnvironmentProblem(with_fix(
            f"the rendezvous endpoint {where} ({key}) accepts connections but does not answer as torch's c10d store within "
            f"{PROBE_S:g} s: another program holds that port on {host}, or node 0's store is stuck; torchrun would wait on it "
            "without end", fix))


def hosted_here(host: str) -> bool:
    """Whether torch's c10d rendezvous hosts its store on this machine for `host` (torch's _matches_machine_hostname)."""
    if host == "localhost":
        return True
    try:
        if ipaddress.ip_address(host).is_loopback:
            return True
    except ValueError:
        pass
    this = socket.gethostname()
    if host == this:
        return True
    try:
        theirs = {a[4][0] for a in socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)}
        ours = socket.getaddrinfo(this, None, proto=socket.IPPROTO_TCP, flags=socket.AI_CANONNAME)
    except (OSError, UnicodeError):
        return False
    return any(a[3] == host or a[4][0] in theirs for a in ours)


def bindable(port: int) -> bool:
    """Whether `port` is free of other listeners here now (bound as torch's store binds it: every address, SO_REUSEADDR).
    A bind refused for another reason (a port below 1024 without the right) is torchrun's to report."""
    for family in (socket.AF_INET6, socket.AF_INET):
        try:
            s = socket.socket(family, socket.SOCK_STREAM)
        except OSError:  # no IPv6 here
            continue
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            s.bind(("", port))
            return True
        except OSError as e:
            return e.errno != errno.EADDRINUSE
        finally:
            s.close()
    return True


def holder(port: int, proc: str = "/proc") -> tuple[int | None, list[str]]:
    """(pid, command line) of the process listening on TCP `port` here, as /proc shows it; (None, []) where it does not."""
    inodes = set()
    for table in ("net/tcp", "net/tcp6"):
        try:
            with open(os.path.join(proc, table), encoding="ascii") as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            if len(cols) > 9 and cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                inodes.add(f"socket:[{cols[9]}]")
    if not inodes:
        return None, []
    for pid in filter(str.isdigit, os.listdir(proc)):
        fds = os.path.join(proc, pid, "fd")
        try:
            links = [os.readlink(os.path.join(fds, fd)) for fd in os.listdir(fds)]
        except OSError:
            continue
        if inodes & set(links):
            try:
                with open(os.path.join(proc, pid, "cmdline"), "rb") as f:
                    return int(pid), [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
            except OSError:
                return int(pid), []
    return None, []


def same_job(command: list[str], rdzv_id: str) -> bool:
    """Whether `command` is a torchrun agent of the rendezvous `rdzv_id` (another node of this job, on this machine)."""
    if not any(os.path.basename(a) == "torchrun" for a in command[:2]):
        return False
    for i, arg in enumerate(command):
        if arg in ("--rdzv-id", "--rdzv_id") and i + 1 < len(command):
            return command[i + 1] == rdzv_id
        if arg.startswith(("--rdzv-id=", "--rdzv_id=")):
            return arg.split("=", 1)[1] == rdzv_id
    return False


def answers_tcp(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=CONNECT_S):
            return True
    except OSError:
        return False


PROBE = """\
import datetime, sys
from torch.distributed import TCPStore
TCPStore(sys.argv[1], int(sys.argv[2]), is_master=False, timeout=datetime.timedelta(seconds=10))
"""


def answers_as_store(host: str, port: int, timeout: float | None = None) -> bool:
    """Whether a c10d client connects to HOST:PORT and gets the store's answer within `timeout` [PROBE_S]. A client that
    fails outright (refused, reset) says nothing about a store to come: that counts as an answer, torchrun waits for it."""
    try:
        subprocess.run([sys.executable, "-c", PROBE, host, str(port)], capture_output=True, timeout=PROBE_S if timeout is None else timeout,
                       env={**os.environ, "TORCH_CPP_LOG_LEVEL": "ERROR"})
    except subprocess.TimeoutExpired:
        return False
    return True

"""The record fp8launch keeps in each folder `plan` writes (and in `run`'s plan folder): the files it wrote there and
the sha256 of their bytes, in `.fp8launch-files.json`. A file there is fp8launch's to replace or remove only while its
bytes are the recorded ones; anything else is the user's and is left alone (launcher/targets/files.py decides).

A folder written before the record existed has none. Its plan.json, when fp8launch wrote it (it holds `spec_sha256`
and `fp8launch_version`), names the files that plan generated (render.files_for): those are taken as fp8launch's, and
the next write records them. Any other file with a generated name is the user's. A record that cannot be read
vouches for nothing: only files whose bytes are already what the plan renders are taken as fp8launch's.

Torch-free and light: launcher/targets/files.py imports it, and the training entrypoint imports that.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from dataclasses import dataclass

RECORD = ".fp8launch-files.json"
ABOUT = ("The files fp8launch wrote into this folder and the sha256 of their bytes. fp8launch replaces or removes a file "
         "here only while its bytes are the recorded ones, and leaves every other file alone.")
ALWAYS = ("plan.json", "torchrun.sh")
"""What every plan generates: a pre-record folder's plan.json that fp8launch wrote vouches for these at least."""


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def record_text(files: dict[str, str]) -> str:
    """The record of `files` (name -> text as written): deterministic, nothing of the machine, so it is committed."""
    record = {"about": ABOUT, "files": {name: digest(text.encode("utf-8")) for name, text in sorted(files.items())}}
    return json.dumps(record, indent=2, sort_keys=True) + "\n"


def read_regular(path: str) -> bytes | None:
    """The bytes of `path` when it is a regular file (never through a link, never opening a FIFO); None otherwise."""
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return None
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb") as f:
        return f.read()


@dataclass(frozen=True, slots=True)
class Owners:
    """What one folder says fp8launch wrote: its record, or (no record) the names its own plan.json generated."""

    folder: str
    recorded: dict[str, str] | None
    """name -> sha256 from the record; None without a usable record."""
    legacy: frozenset[str] = frozenset()
    """No record: the names the folder's plan.json (fp8launch's) generated."""
    problem: str = ""
    """Why the record there vouches for nothing ("" when it is fine or absent)."""

    def why_not(self, name: str, data: bytes | None) -> str:
        """"" when the file `name` (bytes `data`; None: not a regular file) is fp8launch's; else why not, a phrase that
        follows its path ("... was not written by fp8launch (it is not in .fp8launch-files.json)")."""
        path = os.path.join(self.folder, name)
        if data is None:
            if os.path.islink(path):
                return f"is a symbolic link (to {os.readlink(path)}), which fp8launch never writes through"
            return "is not a regular file"
        if self.problem:
            return f"cannot be told to be fp8launch's: {self.problem}"
        if self.recorded is not None:
            if name not in self.recorded:
                return f"was not written by fp8launch (it is not in {RECORD})"
            if self.recorded[name] != digest(data):
                return f"changed since fp8launch wrote it (its bytes are not the ones {RECORD} records)"
            return ""
        if name not in self.legacy:
            return (f"was not written by fp8launch (the folder has no {RECORD}, and no plan.json of fp8launch's that "
                    "generates it)")
        return ""


def owners(folder: str) -> Owners:
    """Read what `folder` says fp8launch wrote there."""
    path = os.path.join(folder, RECORD)
    if not os.path.lexists(path):
        return Owners(folder, None, legacy=_legacy(folder))
    data = read_regular(path)
    if data is None:
        return Owners(folder, None, problem=f"{RECORD} there is not a regular file")
    try:
        files = json.loads(data.decode("utf-8"))["files"]
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in files.items()):
            raise TypeError("a name or sha256 that is not a string")
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        return Owners(folder, None, problem=f"{RECORD} there is not a record fp8launch can read ({type(e).__name__})")
    return Owners(folder, dict(files))


def _legacy(folder: str) -> frozenset[str]:
    """A pre-record folder: the files its plan.json generated, when fp8launch wrote that plan.json."""
    plan_path = os.path.join(folder, "plan.json")
    data = read_regular(plan_path)
    try:
        plan = json.loads(data.decode("utf-8")) if data is not None else None
    except ValueError:
        return frozenset()
    if not isinstance(plan, dict) or "spec_sha256" not in plan or "fp8launch_version" not in plan:
        return frozenset()
    from launcher.planning.plan import load_plan
    from launcher.targets.render import files_for

    try:
        return frozenset(files_for(load_plan(plan_path)))
    except Exception:  # noqa: BLE001 - an older version's plan.json that this one cannot read back: what every plan writes
        return frozenset(ALWAYS)

"""Write rendered files atomically into DIR/<name>/, or compare them with what is there (--check, --diff).
Only files fp8launch writes (GENERATED_NAMES) are ever replaced or removed."""

from __future__ import annotations

import difflib
import os
import tempfile
from dataclasses import dataclass

EXECUTABLE = (".sh", ".sbatch")
DRIFT = ("create", "update", "remove")
"""The changes --check reports as drift. An "extra" file (one fp8launch does not write) is the user's: noted, never removed."""
GENERATED_NAMES = ("plan.json", "torchrun.sh", "deepspeed.json", "fsdp2.json", "slurm.sbatch", "accelerate.yaml")


@dataclass(frozen=True, slots=True)
class Change:
    path: str
    status: str
    """create | update | remove | extra | unchanged"""
    diff: str = ""


def compare(folder: str, files: dict[str, str]) -> list[Change]:
    """What writing `files` into `folder` would change, file by file (extras included)."""
    changes = []
    for name, text in files.items():
        path = os.path.join(folder, name)
        try:
            with open(path, encoding="utf-8", newline="") as f:
                old = f.read()
        except FileNotFoundError:
            changes.append(Change(path, "create", _diff("", text, path)))
            continue
        except (OSError, UnicodeDecodeError):
            old = None
        if old == text:
            changes.append(Change(path, "unchanged"))
        else:
            changes.append(Change(path, "update", _diff(old or "", text, path)))
    if os.path.isdir(folder):
        for name in sorted(os.listdir(folder)):
            if name not in files:
                status = "remove" if name in GENERATED_NAMES else "extra"
                changes.append(Change(os.path.join(folder, name), status))
    return changes


def _diff(old: str, new: str, path: str) -> str:
    return "".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True), f"a/{path}", f"b/{path}"))


def write(folder: str, files: dict[str, str]) -> list[Change]:
    """Write each file through a temporary file + rename; remove stale generated files. Returns the changes."""
    changes = compare(folder, files)
    os.makedirs(folder, exist_ok=True)
    for change in changes:
        name = os.path.basename(change.path)
        if change.status in ("create", "update"):
            write_atomic(change.path, files[name], 0o755 if name.endswith(EXECUTABLE) else 0o644)
        elif change.status == "remove":
            os.remove(change.path)
    return changes


def write_atomic(path: str, text: str, mode: int = 0o644) -> None:
    """Write `text` to `path` through a temporary file in the same folder + rename: a reader (or a crash)
    sees the old file or the new one, never half of one."""
    save_atomic(path, lambda tmp: _write_text(tmp, text), mode)


def save_atomic(path: str, save, mode: int = 0o644) -> None:
    """`save(tmp_path)` writes the file (a figure's savefig, say); it then replaces `path` at once."""
    folder = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=os.path.splitext(path)[1], dir=folder)
    os.close(fd)
    try:
        save(tmp)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def _write_text(path: str, text: str) -> None:
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write(text)

"""Write rendered files atomically into DIR/<name>/, or compare them with what is there (--check, --diff).

Only what fp8launch wrote is ever replaced or removed: the folder's record (launcher/targets/written.py) says which
files those are and their bytes. A file of the plan's name that fp8launch did not write (or whose bytes changed since)
is refused (`--force` replaces it); one the plan no longer writes is kept. Nothing is done through a symbolic link
under the folder, and a folder is never replaced by a file."""

from __future__ import annotations

import difflib
import errno
import os
import tempfile
from dataclasses import dataclass, replace

from launcher.errors import EnvironmentProblem, UsageError, with_fix
from launcher.targets.disk import DiskFull, no_space
from launcher.targets.written import RECORD, Owners, owners, read_regular, record_text

EXECUTABLE = (".sh", ".sbatch")
DRIFT = ("create", "update", "remove", "conflict")
"""The changes --check reports as drift. An "extra" or "kept" file (one fp8launch did not write) is the user's: noted,
never removed."""
GENERATED_NAMES = ("plan.json", "torchrun.sh", "deepspeed.json", "fsdp2.json", "slurm.sbatch", "accelerate.yaml",
                   "trainjob.yaml", "pytorchjob.yaml")
"""Every name a plan may generate (render.files_for); one the plan does not write now is noted as "kept" when it is
not fp8launch's."""
SHAPE = (errno.ENOTDIR, errno.EEXIST, errno.EISDIR, errno.ELOOP, errno.ENAMETOOLONG)
"""OSErrors that say the path is of the wrong kind (input, exit 2); any other (permissions, a read-only file system,
a full disk) says this machine cannot write there (environment, exit 3)."""


@dataclass(frozen=True, slots=True)
class Change:
    path: str
    status: str
    """create | update | remove | unchanged | extra | kept | conflict"""
    diff: str = ""
    why: str = ""
    """kept, conflict: why the file is not fp8launch's ("was not written by fp8launch (...)")."""


def compare(folder: str, files: dict[str, str], *, option: str = "--out") -> list[Change]:
    """What writing `files` (and the record of them) into `folder` would change, file by file (extras included).
    Raises UsageError when `folder` cannot hold them: a link, a file, a folder where a file goes."""
    files = {**files, RECORD: record_text(files)}
    _check_folder(folder, option)
    try:
        present = sorted(os.listdir(folder)) if os.path.isdir(folder) else []
        who = owners(folder) if present else Owners(folder, {})
        changes = [_change(folder, name, text, who, option) for name, text in files.items()]
        for name in present:
            if name not in files:
                changes.append(_leftover(folder, name, who))
    except OSError as e:
        raise output_error(folder, e, option, "read") from e
    return changes


def _change(folder: str, name: str, text: str, who: Owners, option: str) -> Change:
    path = os.path.join(folder, name)
    if not os.path.lexists(path):
        return Change(path, "create", _diff("", text, path))
    if os.path.isdir(path) and not os.path.islink(path):
        raise UsageError(with_fix(f"{path} is a folder, where the plan writes a file, and fp8launch never removes a folder",
                                  f"move it away, or point {option} elsewhere"))
    data = read_regular(path)
    new = text.encode("utf-8")
    if data == new:
        return Change(path, "unchanged")
    diff = _diff(data.decode("utf-8", "replace"), text, path) if data is not None else ""
    why = who.why_not(name, data) if name != RECORD or data is None else ""
    return Change(path, "conflict" if why else "update", diff, why)


def _leftover(folder: str, name: str, who: Owners) -> Change:
    """A file in the folder that the plan does not write: fp8launch's (stale: removed), or the user's (left alone)."""
    path = os.path.join(folder, name)
    generated = name in GENERATED_NAMES or name in (who.recorded or {})
    if not generated or (os.path.isdir(path) and not os.path.islink(path)):
        return Change(path, "extra")
    why = who.why_not(name, read_regular(path))
    return Change(path, "kept", why=why) if why else Change(path, "remove")


def _diff(old: str, new: str, path: str) -> str:
    return "".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True), f"a/{path}", f"b/{path}"))


def refuse(changes: list[Change], *, force: bool = False) -> None:
    """Raise UsageError when writing would overwrite a file fp8launch did not write (unless `force`)."""
    conflicts = [c for c in changes if c.status == "conflict"]
    if not conflicts or force:
        return
    first = conflicts[0]
    more = f" (and {len(conflicts) - 1} more: {', '.join(c.path for c in conflicts[1:])})" if len(conflicts) > 1 else ""
    them = "them" if len(conflicts) > 1 else "it"
    raise UsageError(with_fix(f"{first.path} {first.why}, and the plan writes that file{more}",
                              f"move {them} away, or pass --force to overwrite {them}"))


def prepare(folder: str, files: dict[str, str], *, force: bool = False, option: str = "--out") -> list[Change]:
    """The changes writing would make, after refusing what it must not do (raises UsageError; writes nothing)."""
    changes = compare(folder, files, option=option)
    refuse(changes, force=force)
    return [replace(c, status="update") if c.status == "conflict" else c for c in changes]


def write(folder: str, files: dict[str, str], *, force: bool = False, option: str = "--out") -> list[Change]:
    """Write each file and the record through temporary files + renames; remove the stale files fp8launch wrote.
    `force`: also replace files of the plan's names that fp8launch did not write. Every file is staged before the
    first rename, so a failure (a full disk, a read-only folder) leaves the folder as it was. Returns the changes."""
    changes = prepare(folder, files, force=force, option=option)
    texts = {**files, RECORD: record_text(files)}
    make_folder(folder, option)
    staged: list[tuple[str, str]] = []
    try:
        for c in changes:
            if c.status in ("create", "update"):
                name = os.path.basename(c.path)
                staged.append((_stage(folder, texts[name], 0o755 if name.endswith(EXECUTABLE) else 0o644), c.path))
        for tmp, path in staged:  # the record last: a crash before it leaves files it does not vouch for (refused, kept)
            os.replace(tmp, path)
        for c in changes:
            if c.status == "remove":
                try:
                    os.remove(c.path)
                except FileNotFoundError:
                    pass
    except OSError as e:
        for tmp, _ in staged:
            if os.path.lexists(tmp):
                os.remove(tmp)
        raise output_error(folder, e, option, "write into") from e
    return changes


def _stage(folder: str, text: str, mode: int) -> str:
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(text)
        os.chmod(tmp, mode)
    except BaseException:
        os.remove(tmp)
        raise
    return tmp


def _check_folder(folder: str, option: str) -> None:
    """Refuse a folder that is a link (fp8launch never writes through one under --out) or a file, and a path whose
    nearest existing part is a file or a dangling link (the user's own path may hold links that lead somewhere)."""
    if os.path.islink(folder):
        raise UsageError(with_fix(f"{folder} is a symbolic link (to {os.readlink(folder)}), and fp8launch writes into no folder "
                                  "through a link", f"remove the link (fp8launch then makes the folder), or point {option} elsewhere"))
    _check_path(folder, option)


def _check_path(folder: str, option: str) -> None:
    probe = folder
    while probe and not os.path.lexists(probe):
        parent = os.path.dirname(probe)
        probe = parent if parent != probe else ""
    if not probe or os.path.isdir(probe):
        return
    what = f"a symbolic link to nothing ({os.readlink(probe)})" if os.path.islink(probe) else "a file"
    where = "" if probe == folder else f", so fp8launch cannot make {folder}/"
    raise UsageError(with_fix(f"{probe} is {what}, not a folder{where}", f"move it away, or point {option} elsewhere"))


def make_folder(folder: str, option: str = "--out") -> None:
    """Create `folder` (and its parents), given as `option`: one line, exit 2 when the path is of the wrong kind (a file
    on the way), 3 when this machine cannot write there."""
    _check_path(folder, option)
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as e:
        raise output_error(folder, e, option, "create") from e


def output_error(folder: str, e: OSError, option: str, verb: str) -> Exception:
    """An OSError while reading or writing `folder`: the path's shape (exit 2) or this machine (exit 3), one line."""
    where = f"{e.filename}: " if e.filename and not os.path.basename(e.filename).startswith(".tmp-") else ""
    what = f"cannot {verb} {folder}/ ({where}{e.strerror or e})"
    if e.errno in SHAPE:
        return UsageError(with_fix(what, f"point {option} elsewhere"))
    if no_space(e):
        return DiskFull(f"{folder}/", elsewhere=f"point {option} at a folder on another filesystem")
    fix = {errno.EACCES: "make it writable", errno.EPERM: "make it writable"}.get(e.errno)
    return EnvironmentProblem(with_fix(what, f"{fix + ', or ' if fix else ''}point {option} at a folder you can write to"))


def write_atomic(path: str, text: str, mode: int = 0o644) -> None:
    """Write `text` to `path` through a temporary file in the same folder + rename: a reader (or a crash)
    sees the old file or the new one, never half of one."""
    save_atomic(path, lambda tmp: _write_text(tmp, text), mode)


def save_atomic(path: str, save, mode: int = 0o644) -> None:
    """`save(tmp_path)` writes the file (a figure's savefig, say); it then replaces `path` at once. A full disk is
    DiskFull (exit 3), naming `path`."""
    folder = os.path.dirname(path) or "."
    try:
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=os.path.splitext(path)[1], dir=folder)
    except OSError as e:
        full = _full(e, path)
        if full is None:
            raise
        raise full from e
    os.close(fd)
    try:
        save(tmp)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException as e:
        if os.path.exists(tmp):
            os.remove(tmp)
        full = _full(e, path)
        if full is not None:
            raise full from e
        raise


def _full(error: BaseException, path: str) -> DiskFull | None:
    return DiskFull(path, elsewhere="write to a folder on another filesystem") if no_space(error) else None


def _write_text(path: str, text: str) -> None:
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write(text)

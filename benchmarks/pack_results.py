"""What a GPU session call leaves in OUT, within what the GPU machine brings back of it: at most 8 files, 16 MiB each
and 64 MiB together, none deeper than OUT/a/b/file, each name made of letters, digits, '.', '_' and '-' (the device
README's limits). benchmarks/gpu_session.sh writes every result into a work folder outside OUT and runs this every
PACK_EVERY seconds (45) in the background and once at the end, so a call cut off at its time limit still brings back
the last tarball.

    python3 benchmarks/pack_results.py WORK OUT [--single GLOB[=NAME] ...]     # pack
    python3 benchmarks/pack_results.py --check OUT                             # say what breaks the rules (exit 1)

Writes OUT/results.tgz: every regular file under WORK, under results/, re-packed whole each time. A file that would
take the tarball past 15 MiB is left out, the largest first (a profiler's trace, typically), and RESULTS-LEFT-OUT.txt
in the tarball names each with its size. The tarball is written under a dotted name beside itself, then renamed: OUT
never holds half of one. Each --single copies the files of WORK that GLOB matches to OUT (named NAME where it matches
one file), where they fit: the tables and the key pictures, readable without unpacking. One of the 8 places is kept
free for the tarball's dotted twin. Standard library only: it runs on the GPU machine before anything is installed.
"""

from __future__ import annotations

import argparse
import glob
import io
import os
import re
import shutil
import sys
import tarfile

MAX_FILES = 8
MAX_FILE_BYTES = 16 * 2**20
MAX_TOTAL_BYTES = 64 * 2**20
MAX_FOLDERS = 2
"""OUT/a/b/file comes back, OUT/a/b/c/file does not."""
NAME = re.compile(r"[A-Za-z0-9._-]+")
TARBALL = "results.tgz"
TARBALL_CAP = 15 * 2**20
"""A MiB under the limit: the tarball's own headers and the left-out list are counted in it, but leave room."""
LEFT_OUT = "RESULTS-LEFT-OUT.txt"


def problems(out: str) -> list[str]:
    """What in OUT the GPU machine would not bring back, one line each (empty: all of it comes back)."""
    found, total, files = [], 0, []
    for root, dirs, names in os.walk(out):
        rel = os.path.relpath(root, out)
        depth = 0 if rel == "." else rel.count(os.sep) + 1
        for name in dirs + names:
            if not NAME.fullmatch(name):
                found.append(f"{os.path.join(rel, name)}: the name has other characters than letters, digits, '.', '_', '-'")
        for name in names:
            path = os.path.join(root, name)
            if os.path.islink(path) or not os.path.isfile(path):
                found.append(f"{os.path.relpath(path, out)}: not a plain file")
                continue
            files.append(path)
            size = os.path.getsize(path)
            total += size
            if depth > MAX_FOLDERS:
                found.append(f"{os.path.relpath(path, out)}: {depth} folders down (at most {MAX_FOLDERS})")
            if size > MAX_FILE_BYTES:
                found.append(f"{os.path.relpath(path, out)}: {size / 2**20:.1f} MiB (at most {MAX_FILE_BYTES // 2**20} MiB a file)")
    if len(files) > MAX_FILES:
        found.append(f"{len(files)} files (at most {MAX_FILES})")
    if total > MAX_TOTAL_BYTES:
        found.append(f"{total / 2**20:.1f} MiB in all (at most {MAX_TOTAL_BYTES // 2**20} MiB)")
    return found


def _files(work: str) -> list[str]:
    out = []
    for root, dirs, names in os.walk(work):
        dirs.sort()
        for name in sorted(names):
            path = os.path.join(root, name)
            if os.path.isfile(path) and not os.path.islink(path):
                out.append(os.path.relpath(path, work))
    return out


def _tarball(work: str, members: dict[str, bytes], left: list[tuple[str, int, str]]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=6) as tar:
        entries = list(members.items())
        if left:
            text = "".join(f"{rel}\t{size} bytes\t{why}\n" for rel, size, why in left)
            entries.append((LEFT_OUT, text.encode()))
        for rel, data in entries:
            info = tarfile.TarInfo(os.path.join("results", rel))
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def pack(work: str, out: str, cap: int = TARBALL_CAP) -> tuple[int, int, list[tuple[str, int, str]]]:
    """Write OUT/results.tgz from WORK; returns (files in it, its bytes, [(left-out file, bytes, why)])."""
    members: dict[str, bytes] = {}
    left: list[tuple[str, int, str]] = []
    for rel in _files(work):
        path = os.path.join(work, rel)
        try:
            size = os.path.getsize(path)
            if size > cap:
                left.append((rel, size, f"over {cap / 2**20:.3g} MiB alone"))
                continue
            with open(path, "rb") as f:  # read whole: a file still being written goes in as it was at this moment
                members[rel] = f.read()
        except OSError:
            continue  # removed while packing: the next pack sees what replaced it
    data = _tarball(work, members, left)
    while len(data) > cap and members:
        biggest = max(members, key=lambda rel: len(members[rel]))
        left.append((biggest, len(members.pop(biggest)), f"the tarball would pass {cap / 2**20:.3g} MiB"))
        data = _tarball(work, members, left)
    part = os.path.join(out, f".{TARBALL}.part")
    with open(part, "wb") as f:
        f.write(data)
    os.replace(part, os.path.join(out, TARBALL))
    return len(members), len(data), left


def _out_files(out: str) -> list[str]:
    return [os.path.join(root, n) for root, _, names in os.walk(out) for n in names]


def copy_singles(work: str, out: str, singles: list[str]) -> list[str]:
    """Copy each --single's matches from WORK to OUT where they fit the rules; returns what was copied (names in OUT)."""
    copied = []
    for single in singles:
        pattern, _, rename = single.partition("=")
        matches = sorted(p for p in glob.glob(os.path.join(work, pattern)) if os.path.isfile(p))
        for path in matches:
            name = rename if rename and len(matches) == 1 else os.path.basename(path)
            target = os.path.join(out, name)
            if not NAME.fullmatch(name):
                print(f"pack_results: {name}: not copied (a name of letters, digits, '.', '_', '-' only comes back)", file=sys.stderr)
                continue
            size = os.path.getsize(path)
            others = [p for p in _out_files(out) if os.path.abspath(p) != os.path.abspath(target)]
            total = sum(os.path.getsize(p) for p in others) + size
            if size > MAX_FILE_BYTES or len(others) + 1 > MAX_FILES - 1 or total > MAX_TOTAL_BYTES - TARBALL_CAP:
                print(f"pack_results: {name}: not copied ({size} bytes; OUT holds {len(others)} files): it is in {TARBALL}",
                      file=sys.stderr)
                continue
            shutil.copyfile(path, target)
            copied.append(name)
    return copied


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("work", nargs="?")
    parser.add_argument("out")
    parser.add_argument("--single", action="append", default=[], metavar="GLOB[=NAME]")
    parser.add_argument("--check", action="store_true", help="only say what in OUT breaks the rules")
    args = parser.parse_args(argv)
    if args.check:
        found = problems(args.out)
        for line in found:
            print(f"pack_results: OUT/{line}: the GPU machine would not bring it back")
        return 1 if found else 0
    if not args.work or not os.path.isdir(args.work):
        parser.error(f"WORK {args.work!r} is not a folder")
    os.makedirs(args.out, exist_ok=True)
    copied = copy_singles(args.work, args.out, args.single)
    count, size, left = pack(args.work, args.out)
    note = "; left out: " + ", ".join(f"{rel} ({b / 2**20:.1f} MiB)" for rel, b, _ in left) if left else ""
    print(f"pack_results: {TARBALL}: {count} files, {size / 2**20:.2f} MiB; single files: {', '.join(copied) or 'none'}{note}",
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

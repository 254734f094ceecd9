"""Stand-ins for what benchmarks/te_install.sh needs of a GPU machine and cannot have here: Transformer Engine's core
wheel in parts (random bytes, split and summed the way `gpu-wheelhouse te` splits them), a CUDA toolkit's nvcc, the
CUDA headers in the nvidia pip packages' layout (nvidia/<package>/include), and a pip whose "build" of the binding
takes a few seconds and leaves an importable transformer_engine.pytorch. Everything else is the real script."""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CORE = "transformer_engine_cu13-2.20.2-py3-none-manylinux_2_28_x86_64.whl"
HEADERS = {"nccl": "nccl.h", "cudnn": "cudnn.h", "cublas": "cublasLt.h", "cu13": "cuda_runtime.h"}


def parts_folder(folder: Path, payload: bytes = b"", part_size: int = 1000) -> bytes:
    """What `gpu-wheelhouse te` writes into `folder`: part-00.. of the core wheel (split -d), te-core.sha256, deps/."""
    payload = payload or os.urandom(3500)
    (folder / "deps").mkdir(parents=True)
    for i in range(0, len(payload), part_size):
        (folder / f"part-{i // part_size:02d}").write_bytes(payload[i:i + part_size])
    (folder / "te-core.sha256").write_text(f"{hashlib.sha256(payload).hexdigest()}  {CORE}\n")
    (folder / "deps" / "transformer_engine-2.20.2-py3-none-any.whl").write_bytes(b"te")
    (folder / "deps" / "transformer_engine_torch-2.20.2.tar.gz").write_bytes(b"sdist")
    return payload


class Machine:
    """A fake GPU machine's toolchain under `root`: CUDA_HOME with bin/nvcc (no headers), a site folder on PYTHONPATH
    whose nvidia/*/include hold the headers (the image's pip packages), and PIP, which logs each call with the
    build's environment and, for the binding's sdist, sleeps `build_s` then writes transformer_engine.pytorch."""

    def __init__(self, root: Path, *, headers: bool = True, nvcc: bool = True, build_s: float = 0.0):
        self.root = root
        self.cuda, self.site, self.calls = root / "cuda", root / "site", root / "pip-calls"
        (self.cuda / "bin").mkdir(parents=True)
        (self.cuda / "include").mkdir()
        self.site.mkdir()
        if nvcc:
            nvcc_path = self.cuda / "bin" / "nvcc"
            nvcc_path.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 13.0, V13.0.48'\n")
            nvcc_path.chmod(0o755)
        if headers:
            for package, header in HEADERS.items():
                (self.site / "nvidia" / package / "include").mkdir(parents=True)
                (self.site / "nvidia" / package / "include" / header).write_text("/* stand-in */\n")
        self.pip = root / "pip"
        te = self.site / "transformer_engine"
        self.pip.write_text(
            "#!/bin/sh\n"
            f'echo "NVTE_BUILD_USE_NVIDIA_WHEELS=$NVTE_BUILD_USE_NVIDIA_WHEELS NVTE_PYTORCH_FORCE_BUILD=$NVTE_PYTORCH_FORCE_BUILD '
            f'CUDA_HOME=$CUDA_HOME CPATH=$CPATH | $*" >> {self.calls}\n'
            'case "$*" in *transformer_engine_torch-*)\n'
            f"  sleep {build_s}\n"
            f"  mkdir -p {te}/pytorch && echo '__version__ = \"2.20.2\"' > {te}/__init__.py && : > {te}/pytorch/__init__.py\n"
            "  echo 'Successfully installed transformer_engine_torch-2.20.2' ;;\n"
            "esac\n")
        self.pip.chmod(0o755)

    def env(self, **extra) -> dict:
        """The environment of a call: this venv's python first (the image's python3), no other CUDA in sight."""
        return {"PATH": f"{os.path.dirname(sys.executable)}:/usr/bin:/bin", "HOME": str(self.root), "CUDA_HOME": str(self.cuda),
                "CUDA_ROOTS": str(self.root / "no-cuda"), "PIP": str(self.pip), "PYTHONPATH": f"{self.site}:{REPO}",
                "TE_POLL": "0.2", **extra}

    def include_dirs(self) -> list[str]:
        return sorted(str(self.site / "nvidia" / p / "include") for p in HEADERS)

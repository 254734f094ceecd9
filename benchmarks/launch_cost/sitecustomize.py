"""On PYTHONPATH for benchmarks/launch_cost.py's baseline only, never in the package: in a training rank
(fp8launch-train), torchao's Triton-only Inductor patch runs as torchao applies it, as before fp8launch skipped it on
CPU (launcher/train/precision/torchao_fp8.skips_triton_codegen_patch)."""

import os
import sys

if os.path.basename(sys.argv[0]) == "fp8launch-train":
    import launcher.train.precision.torchao_fp8 as _torchao_fp8

    _torchao_fp8.skips_triton_codegen_patch = lambda device: False

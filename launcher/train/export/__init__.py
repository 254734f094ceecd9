"""`fp8launch export`: a complete checkpoint of a run -> its high-precision weights, as a Hugging Face
folder that `transformers.AutoModelForCausalLM.from_pretrained` loads, or as one torch.save file.

    pipeline.py  which checkpoint; read it, map it, write it (`export`)
    read.py      checkpoint (DCP of DDP/FSDP2, tensor parallel or not; DeepSpeed ZeRO 0-3) -> weights by name
    hf.py        builtin Llama -> LlamaForCausalLM, hf: models -> their own class: config and names
    write.py     safetensors shards + index (or model.pt), written beside the target and renamed onto it
    quant.py     --quant: the FP8 formats (codes, scales, config.json's quantization_config)
    layers.py    --quant: which Linear layers are quantized, and why the others stay in high precision
    card.py      --quant: the measured logit gap and the README the export carries
    quantized.py --quant: one export's format and layers, then its gap, README and record
    fp8_stored.py weights a run stored in FP8: from their master copy, or refused naming why

This module holds the names the others share and imports no torch (the CLI module imports it).
"""

from __future__ import annotations

import json
import os

MARKER = "fp8launch-export.json"
"""Written into every export: what it was made from. A folder holding it may be replaced by a new export."""
DTYPES = ("bf16", "fp32")
FORMATS = ("hf", "torch")
QUANTS = ("fp8-block", "fp8-channel", "mxfp8")
"""--quant: the FP8 formats (launcher/train/export/quant.py)."""
KEY = "RUN_DIR"


def exported_files(folder: str) -> set[str]:
    """The names the export in `folder` wrote (its marker among them), as its marker lists them; empty when unreadable."""
    try:
        with open(os.path.join(folder, MARKER), encoding="utf-8") as f:
            files = json.load(f).get("files")
    except (OSError, ValueError, AttributeError):
        return set()
    return {name for name in files if isinstance(name, str)} if isinstance(files, list) else set()


def is_export(folder: str) -> bool:
    """Whether `folder` holds an export fp8launch wrote (its marker names a format)."""
    try:
        with open(os.path.join(folder, MARKER), encoding="utf-8") as f:
            return json.load(f).get("format") in FORMATS
    except (OSError, ValueError, AttributeError):
        return False

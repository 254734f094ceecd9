"""Known-harmless library messages, filtered by their exact text (every other message gets through).

Each worker would print them once per rank, on every run:
- torchao's optional C++ kernels that this torch build cannot load (`_C_mxfp8`, `_C_cutlass_90a`:
  MXFP8 and CUTLASS sm90a kernels; fp8launch's torchao recipes, tensorwise and rowwise, use
  neither): torchao/__init__.py logs `Failed to load {file}: {e}` at import;
- torch's deprecation warning for torchao's own Enums registered as pytree constants
  (torch/utils/_pytree.py: "... is an Enum subclass and is now natively supported ...");
- torch 2.13's deprecation of `torch.distributed.all_gather_into_tensor` / `reduce_scatter_tensor`,
  which DeepSpeed 0.19's ZeRO calls on every step (a FutureWarning per rank and call site);
- AOT autograd's advice that torchao's optimizer-state subclasses (OptimStateFp8, OptimState8bit) implement
  `_stable_hash_for_caching` (a UserWarning per rank when the low-bit optimizer's step is first compiled).
"""

from __future__ import annotations

import logging
import re

TORCHAO_OPTIONAL_KERNEL = re.compile(
    r"Failed to load \S*/torchao/_C_(?:mxfp8|cutlass_90a)\.[\w.-]*\.so: "
    r"Could not load this library: \S*/torchao/_C_(?:mxfp8|cutlass_90a)\.[\w.-]*\.so")
PYTREE_ENUM = ("%s is an Enum subclass and is now natively supported by torch.compile as an opaque value type. Calling "
               "register_constant() on Enum subclasses is deprecated and will be an error in a future release.")


def _torchao_kernel(record: logging.LogRecord) -> bool:
    return TORCHAO_OPTIONAL_KERNEL.fullmatch(record.getMessage()) is not None


def _torchao_enum(record: logging.LogRecord) -> bool:
    return (record.msg == PYTREE_ENUM and len(record.args or ()) == 1
            and getattr(record.args[0], "__module__", "").split(".")[0] == "torchao")


HARMLESS = {"torchao": _torchao_kernel, "torch.utils._pytree": _torchao_enum}
"""Logger name -> a test for the records of it that are known to be harmless."""


class _Drop(logging.Filter):
    def __init__(self, harmless):
        super().__init__()
        self.harmless = harmless

    def filter(self, record: logging.LogRecord) -> bool:
        return not self.harmless(record)


DEPRECATED_COLLECTIVES = r"`torch\.distributed\.(all_gather_into_tensor|reduce_scatter_tensor)` is deprecated"
"""The FutureWarning text (torch/distributed/distributed_c10d.py) of the collectives DeepSpeed still calls."""


TORCHAO_STATE_HASH = r"OptimState(Fp8|8bit|4bit) does not implement _stable_hash_for_caching"
"""The UserWarning text (torch/_functorch/_aot_autograd/autograd_cache.py) for torchao's optimizer-state subclasses."""


def install() -> None:
    """Filter the known-harmless messages out of their loggers (before torch and torchao are imported)."""
    import warnings

    warnings.filterwarnings("ignore", message=DEPRECATED_COLLECTIVES, category=FutureWarning)
    warnings.filterwarnings("ignore", message=TORCHAO_STATE_HASH, category=UserWarning)
    for name, harmless in HARMLESS.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _Drop) for f in logger.filters):
            logger.addFilter(_Drop(harmless))

"""Feed deepspeed.json files to DeepSpeed's own config parser (DeepSpeedConfig), as deepspeed.initialize does.

Usage: python tests/ds_config_check.py WORLD_SIZE FILE... ; prints one JSON line per file with what DeepSpeed parsed.
Run in its own process: it initialises deepspeed.comm (gloo, one process) so the parser sees a real rank.
"""

import json
import os
import sys

os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("MASTER_PORT", "29731"), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")

from launcher.train.engines.deepspeed_engine import without_mlflow, without_shm_comm  # noqa: E402

with without_mlflow():  # as a training rank imports it: not the 2.3 s of mlflow's pandas and fastapi
    import deepspeed
from deepspeed.runtime.config import DeepSpeedConfig  # noqa: E402

without_shm_comm()  # nor the g++ build of the shared-memory op init_distributed loads on CPU (~35 CPU-s cold)
deepspeed.init_distributed(dist_backend="gloo", verbose=False)


class DataParallelWorld:
    """DeepSpeed's mpu protocol: the data-parallel world size the plan was made for."""

    def __init__(self, size: int):
        self.size = size

    def get_data_parallel_world_size(self) -> int:
        return self.size


world = int(sys.argv[1])
for path in sys.argv[2:]:
    with open(path) as f:
        cfg = DeepSpeedConfig(json.load(f), mpu=DataParallelWorld(world))
    print(json.dumps({
        "file": path,
        "train_batch_size": cfg.train_batch_size,
        "micro": cfg.train_micro_batch_size_per_gpu,
        "accum": cfg.gradient_accumulation_steps,
        "zero_stage": cfg.zero_optimization_stage,
        "bf16": cfg.bfloat16_config.enabled if hasattr(cfg, "bfloat16_config") else cfg.bfloat16_enabled,
        "fp16": cfg.float16_config.enabled if hasattr(cfg, "float16_config") else cfg.fp16_enabled,
        "clip": cfg.gradient_clipping,
        "offload_optimizer": str(cfg.zero_config.offload_optimizer.device) if cfg.zero_config.offload_optimizer else "none",
        "overlap_comm": cfg.zero_config.overlap_comm,
        "contiguous_gradients": cfg.zero_config.contiguous_gradients,
        "reduce_bucket_size": cfg.zero_config.reduce_bucket_size,
    }))

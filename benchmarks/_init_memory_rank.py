"""One rank of benchmarks/init_memory.py (run under torchrun): the entrypoint's own build
(launcher.train.main.build_run: meta device, precision, engine, materialisation), then one step;
writes {rank, vmhwm after imports / init / first step, seconds} as one JSON line to OUT.rank<R>."""

import json
import os
import sys
import time

T0 = time.monotonic()


def vm(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


plan_path, out = sys.argv[1], sys.argv[2]
from launcher.train.engines import deepspeed_engine  # noqa: E402
from launcher.train.main import build_run  # noqa: E402
from launcher.train.parallel import distributed  # noqa: E402  (imports torch)

before_engine = {}
if os.environ.get("INIT_BENCH_ZERO3_WHOLE") == "1":
    # the baseline: ZeRO-3 as before partition-as-you-go, the whole model materialised before deepspeed.initialize
    deepspeed_engine.zero3_partition = lambda deepspeed, config: None
_import = deepspeed_engine.import_deepspeed


def import_deepspeed(*args, **kwargs):
    """DeepSpeed with VmHWM read just before deepspeed.initialize: the model built and (ZeRO-3) partitioned,
    before DeepSpeed's own optimizer partitions and buckets."""
    ds = _import(*args, **kwargs)
    initialize = ds.initialize

    def measured(**kw):
        before_engine["vmhwm"] = vm("VmHWM")
        return initialize(**kw)

    ds.initialize = measured
    return ds


deepspeed_engine.import_deepspeed = import_deepspeed
if os.environ.get("INIT_BENCH_HF_EAGER") == "1":
    # the baseline: an hf: folder with weights loaded whole by from_pretrained on every rank, then sharded
    import launcher.train.models as models

    models.build_for_run = lambda spec, spec_dir: (models.build_model(spec, spec_dir), None)
imported = vm("VmHWM")
trainer, logger = build_run(plan_path)
t_init = time.monotonic() - T0
init_hwm = vm("VmHWM")
trainer.run()
t_step = time.monotonic() - T0
logger.close()
module = trainer.state.engine.module
params = sum(getattr(p, "ds_numel", p.numel()) for p in module.parameters())  # DTensors: global shape; ZeRO-3: ds_numel
record = {"rank": int(os.environ.get("RANK", 0)), "params": params, "vmhwm_after_imports": imported, "vmhwm_after_init": init_hwm,
          "vmhwm_before_engine_init": before_engine.get("vmhwm"), "vmhwm_after_first_step": vm("VmHWM"),
          "seconds_to_initialised": round(t_init, 2), "seconds_to_first_step_done": round(t_step, 2)}
with open(f"{out}.rank{record['rank']}", "w") as f:
    f.write(json.dumps(record) + "\n")
distributed.barrier()
distributed.destroy()
distributed.exit_now(0)  # gloo threads (see launcher.train.parallel.distributed.exit_now)

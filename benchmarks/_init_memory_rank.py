"""One rank of benchmarks/init_memory.py (run under torchrun): the entrypoint's own build
(launcher.train.main.build_run: meta device, precision, FSDP2, materialisation), then one step;
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
from launcher.train import distributed  # noqa: E402  (imports torch)
from launcher.train.main import build_run  # noqa: E402

imported = vm("VmHWM")
trainer, logger = build_run(plan_path)
t_init = time.monotonic() - T0
init_hwm = vm("VmHWM")
trainer.run()
t_step = time.monotonic() - T0
logger.close()
module = trainer.state.engine.module
params = sum(p.numel() for p in module.parameters())  # DTensors report their global shape
record = {"rank": int(os.environ.get("RANK", 0)), "params": params, "vmhwm_after_imports": imported, "vmhwm_after_init": init_hwm,
          "vmhwm_after_first_step": vm("VmHWM"), "seconds_to_initialised": round(t_init, 2), "seconds_to_first_step_done": round(t_step, 2)}
with open(f"{out}.rank{record['rank']}", "w") as f:
    f.write(json.dumps(record) + "\n")
distributed.barrier()
distributed.destroy()
os._exit(0)  # gloo threads (see launcher.train.main.run_process)

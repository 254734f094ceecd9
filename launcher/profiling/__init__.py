"""Where a training step's time goes: a torch.profiler trace classified into parts, per layer, against a baseline.
Torch-free (it reads the Chrome trace JSON), so `fp8launch bench` and the tests use it without a GPU or torch.

    trace.py    the trace read into host trees, step windows and device kernels
    parts.py    the parts of a step (gemm_fp8, gemm_high_precision, attention, fp8_cast, loss, optimizer,
                communication, other, idle) and how work is put in one
    layers.py   which layer a GEMM belongs to, and its FLOPs, from the recorded shapes
    record.py   one run's record (profile.json's RUN)
    compare.py  a spec's record against its baseline's: the ceiling, the advice, the prediction beside it, the picture
"""

PROFILE_ENV = "FP8LAUNCH_PROFILE"
"""Steps the training profiles after the warm-up, set by `fp8launch run --profile N` / `bench --profile` in the
environment of the processes it starts (plan.json stays the spec's); unset or 0: no profiling."""
PROFILE_WARMUP_ENV = "FP8LAUNCH_PROFILE_WARMUP"
"""Steps trained before the profiler starts (the last of them is the profiler's own warm-up)."""

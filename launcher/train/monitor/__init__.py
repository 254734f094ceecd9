"""The FP8 numerics monitor: per-layer amax, scale, underflow and overflow of every FP8 cast,
sampled every monitor.fp8_stats_every steps into <output_dir>/fp8_stats.jsonl (docs/monitor.md).

stats.py   the math of one cast (torchao's scaling; shares of flushed and saturated values)
hooks.py   which modules run in FP8, and the hooks that measure them on a sampled step
records.py the reduction across ranks and the records
alerts.py  the warning lines and the end-of-run summary
monitor.py the training-loop callback
"""

from .monitor import STATS_FILE, FP8Monitor, build_monitor, monitor_targets, unwatched_note

__all__ = ["STATS_FILE", "FP8Monitor", "build_monitor", "monitor_targets", "unwatched_note"]

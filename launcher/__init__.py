"""fp8launch: one precision spec -> validated FP8 training configs and a launcher."""

__version__ = "0.1.0"

ENTRYPOINT = "fp8launch-train"
"""The console script of the training entrypoint (pyproject.toml [project.scripts]) that torchrun starts
with --no-python: unlike `python -m launcher.train`, it cannot be shadowed by a `launcher/` package in
the folder a run starts from."""

"""The spec and what it means, torch-free (planning runs in CI and pre-commit hooks): read and validate a
spec (read.py, schema.json), resolve it into a Plan (plan.py), check the known-bad combinations
(rules/), and what planning derives from it: memory, precision table, speed prediction (predict/),
the model catalogue (models.py), hardware and installed-package facts, the support matrix."""

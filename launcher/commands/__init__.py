"""The commands behind the CLI, one module each (cli.py parses options and prints; these do the work):
plan (the planning pipeline and its text), run (preflight, torchrun / SLURM / kubectl), bench, tune,
doctor, init, report."""

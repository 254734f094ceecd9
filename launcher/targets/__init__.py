"""What writes the outputs a plan becomes: the rendered configs (render.py, Jinja templates), the
Kubernetes manifests, the YAML text they use, atomic file writes (files.py), the project root that
generated paths are relative to."""

"""A torch.profiler Chrome trace (the JSON `export_chrome_trace` writes, gzipped or not) read into what the
parts of a step need. Torch-free: it reads JSON, so a trace recorded on a GPU machine is classified the same way
anywhere.

    trace = read_trace("profile/trace.json.gz")
    for window in trace.steps:                      # the fp8launch.step annotations (else ProfilerStep#N)
        for node in trace.nodes_in(window): ...     # CPU ops and annotations on the step's thread, as a tree
    trace.kernels                                   # device kernels, each with the chain of CPU events that launched it

What the format holds (Kineto's trace, as torch 2.x writes it): complete events (`"ph": "X"`) with `cat`
"cpu_op" (an ATen op, an autograd node, a custom autograd Function), "user_annotation" (record_function: our
fp8launch.* labels, Optimizer.step#..., ProfilerStep#N, FSDP::*), "cuda_runtime" / "cuda_driver" (a launch, with
`args.correlation`), "kernel" / "gpu_memcpy" / "gpu_memset" (device work, `args.correlation` naming its launch);
`ts` and `dur` in microseconds on one clock; `args` "Input Dims" / "Input type" with record_shapes.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field
from typing import Any, Iterator

HOST_CATS = ("cpu_op", "user_annotation", "python_function")
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
LAUNCH_CATS = ("cuda_runtime", "cuda_driver", "runtime")
STEP = "fp8launch.step"
"""The annotation the training loop puts around each optimizer step (launcher/train/loop.py)."""


@dataclass(eq=False, slots=True)
class Node:
    """One host event with its place in the nesting of its thread."""

    name: str
    cat: str
    ts: float
    dur: float
    thread: tuple
    args: dict[str, Any]
    parent: Node | None = None
    children: list[Node] = field(default_factory=list)

    @property
    def end(self) -> float:
        return self.ts + self.dur

    @property
    def self_time(self) -> float:
        """Its duration less its children's (the time spent in this event itself)."""
        return max(0.0, self.dur - sum(c.dur for c in self.children))

    def chain(self) -> list[Node]:
        """This event and every event enclosing it, outermost first."""
        out, node = [], self
        while node is not None:
            out.append(node)
            node = node.parent
        return out[::-1]


@dataclass(slots=True)
class Kernel:
    """Device work: a kernel, memcpy or memset, with the host events that launched it (outermost first)."""

    name: str
    ts: float
    dur: float
    stream: tuple
    launch: Node | None
    """The runtime call (cudaLaunchKernel, ...) that launched it; its `chain()` names the op and annotations."""

    @property
    def end(self) -> float:
        return self.ts + self.dur


@dataclass(slots=True)
class Trace:
    roots: dict[tuple, list[Node]]
    """Per host thread (pid, tid): its outermost events, in time order."""
    steps: list[Node]
    """The step windows, in time order."""
    kernels: list[Kernel]

    @property
    def on_device(self) -> bool:
        """Whether a device ran kernels (a GPU trace); on a CPU trace the host ops are the work."""
        return bool(self.kernels)

    def nodes_in(self, step: Node) -> Iterator[Node]:
        """Every host event inside `step` on its thread (the step annotation's descendants), depth first."""
        stack = list(reversed(step.children))
        while stack:
            node = stack.pop()
            yield node
            stack.extend(reversed(node.children))

    def all_nodes(self) -> Iterator[Node]:
        for roots in self.roots.values():
            stack = list(reversed(roots))
            while stack:
                node = stack.pop()
                yield node
                stack.extend(reversed(node.children))


def load(path: str) -> dict:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return json.load(f)


def read_trace(source: str | dict) -> Trace:
    """The trace at `source` (a path, or the loaded JSON) as host trees, step windows and device kernels."""
    data = load(source) if isinstance(source, str) else source
    events = data["traceEvents"] if isinstance(data, dict) else data
    host: dict[tuple, list[Node]] = {}
    launches: dict[Any, Node] = {}
    device = []
    for e in events:
        if e.get("ph") != "X" or "dur" not in e:
            continue
        cat = e.get("cat", "")
        thread = (e.get("pid"), e.get("tid"))
        if cat in DEVICE_CATS:
            device.append(e)
        elif cat in HOST_CATS or cat in LAUNCH_CATS:
            node = Node(e["name"], cat, float(e["ts"]), float(e["dur"]), thread, e.get("args") or {})
            host.setdefault(thread, []).append(node)
            if cat in LAUNCH_CATS and "correlation" in node.args:
                launches[node.args["correlation"]] = node
    roots = {thread: _nest(nodes) for thread, nodes in host.items()}
    steps = sorted((n for rs in roots.values() for n in _walk(rs) if n.name == STEP and n.cat == "user_annotation"),
                   key=lambda n: n.ts)
    if not steps:
        steps = sorted((n for rs in roots.values() for n in rs if n.name.startswith("ProfilerStep#")), key=lambda n: n.ts)
    kernels = [Kernel(e["name"], float(e["ts"]), float(e["dur"]), (e.get("pid"), e.get("tid")),
                      launches.get((e.get("args") or {}).get("correlation"))) for e in device]
    return Trace(roots=roots, steps=steps, kernels=sorted(kernels, key=lambda k: k.ts))


def _walk(nodes: list[Node]) -> Iterator[Node]:
    stack = list(reversed(nodes))
    while stack:
        node = stack.pop()
        yield node
        stack.extend(reversed(node.children))


def _nest(nodes: list[Node]) -> list[Node]:
    """Nest one thread's events by time: an event lies inside the nearest earlier one that covers it (ties:
    the longer encloses the shorter). Returns the outermost ones."""
    nodes.sort(key=lambda n: (n.ts, -n.dur))
    roots: list[Node] = []
    stack: list[Node] = []
    for node in nodes:
        while stack and node.ts >= stack[-1].end - 1e-3:  # 1 ns of float slack in the exported microseconds
            stack.pop()
        while stack and node.end > stack[-1].end + 1e-3:  # overlaps without nesting (rare, async annotations): not inside
            stack.pop()
        if stack:
            node.parent = stack[-1]
            stack[-1].children.append(node)
        else:
            roots.append(node)
        stack.append(node)
    return roots

"""How the plan is launched and what the run sets up: sections nothing reads, an eval that is not held out, the
Accelerate export, Kubernetes (launch.launcher = "kubernetes"), and features that did not take effect."""

from __future__ import annotations

from launcher.planning.backends import BACKENDS, MSAMP, backend_of
from launcher.planning.rules.core import Facts, Rule
from launcher.planning.rules.predicates import strategy


def _unused_sections(f: Facts) -> list[str]:
    plan, present = f.plan, f.plan.present
    p = plan.precision
    reads = {
        **{f"precision.{b.section}": backend_of(p) is b for b in BACKENDS.values()},
        "precision.msamp": backend_of(p) is MSAMP or bool(plan.msamp_native),  # its opt level, planned natively
        "distributed.fsdp2": strategy(f) == "fsdp2",
        "distributed.deepspeed": strategy(f) == "deepspeed",
        "distributed.pipeline": plan.distributed.pipeline_parallel > 1,
        "launch.slurm": plan.launch.launcher == "slurm",
        "launch.kubernetes": plan.launch.launcher == "kubernetes",
    }
    return [section for section, read in reads.items() if section in present and not read]


def _accelerate_unsupported(f: Facts) -> str:
    p = f.plan.precision
    if p.mode == "fp8" and (p.keep_first_blocks or p.keep_last_blocks):
        return "precision.keep_first_blocks / keep_last_blocks"
    b = backend_of(p)
    if b is not None and b.accelerate_recipes is not None and b.recipe(p) not in b.accelerate_recipes:
        return f"{b.recipe_key} = {b.recipe(p)!r}"
    return ""


RESERVED_ENV = ("PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT",
                "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK")
"""Set by the operators on every node (Trainer's TorchRunReservedEnvNames, training-operator's envvar.go);
the TrainJob webhook rejects the PET_* ones in trainer.env, and a second value would be ambiguous."""


def _k8s(f: Facts) -> bool:
    return f.plan.launch.launcher == "kubernetes"


def _k8s_reserved_env(f: Facts) -> list[str]:
    return sorted(k for k in f.plan.launch.env if k in RESERVED_ENV)


def _writes_checkpoints(f: Facts) -> bool:
    return f.plan.train.checkpoint_every > 0 or f.plan.train.checkpoint_at_end


RULES: tuple[Rule, ...] = (
    Rule(id="SECTION-UNUSED", severity="warning", stage="plan",
         when="a backend/strategy/launcher section is present that the chosen one never reads",
         why="a section nothing reads is a silent no-op; that is how Accelerate configs go wrong (misnamed keys ignored).",
         fix="delete the section, or choose the backend/strategy/launcher that reads it",
         condition=lambda f: bool(_unused_sections(f)),
         detail=lambda f: "; ".join(f"[{s}] is ignored with this plan" for s in _unused_sections(f)) + "."),
    Rule(id="EVAL-NOT-HELD-OUT", severity="warning", stage="plan",
         when="eval.data names the same file or factory as train.data (synthetic excepted)",
         why="an evaluation on the data the run trains on measures fit, not generalization: the FP8-vs-bf16 comparison [eval] "
             "exists for needs batches neither trained on (eval.data = \"synthetic\" draws from streams no rank trains on).",
         fix="point eval.data at a held-out split (another file, prefix or dataset folder)",
         condition=lambda f: f.plan.eval.data not in ("", "synthetic") and f.plan.eval.data == f.plan.train.data),
    Rule(id="ACCELERATE-UNSUPPORTED", severity="error", stage="plan",
         when="export.accelerate with a recipe Accelerate's config file cannot select (torchao rowwise*, TE current/block/nvfp4), or kept "
              "blocks",
         why="accelerate.yaml selects torchao's default (tensorwise) and TE's DelayedScaling or MXFP8 only; writing it anyway would train "
             "with another recipe than the spec says.",
         fix='set export.accelerate = false (train with `fp8launch run`), or precision.torchao.recipe = "tensorwise" / '
             'precision.te.recipe = "delayed" or "mxfp8"',
         condition=lambda f: f.plan.export.accelerate and bool(_accelerate_unsupported(f)),
         detail=lambda f: f"accelerate.yaml cannot express {_accelerate_unsupported(f)}."),
    Rule(id="K8S-IMAGE-MISSING", severity="error", stage="plan",
         when='launch.launcher = "kubernetes" and launch.kubernetes.image is empty',
         why="every node's container starts from this image; it must hold fp8launch, torch and the backend. There is no sensible default.",
         fix='set launch.kubernetes.image = "REGISTRY/IMAGE:TAG" (an image with fp8launch and the backend installed)',
         condition=lambda f: _k8s(f) and not f.plan.launch.kubernetes.image.strip()),
    Rule(id="K8S-NO-SHARED-OUTPUT", severity="error", stage="plan",
         when='launch.launcher = "kubernetes", checkpoints are written (train.checkpoint_every > 0 or train.checkpoint_at_end) and '
              'launch.kubernetes.volume_claim is empty',
         why="without a volume claim, train.output_dir is each pod's own disk: checkpoints vanish with the pods when the job ends, "
             "a sharded multi-node checkpoint is split across disks no pod can read together, and resume finds nothing. "
             "An error, not a warning: the loss shows only after the GPU hours are spent.",
         fix="set launch.kubernetes.volume_claim = \"CLAIM\" (a ReadWriteMany PersistentVolumeClaim), or train.checkpoint_every = 0 and "
             "train.checkpoint_at_end = false",
         condition=lambda f: _k8s(f) and not f.plan.launch.kubernetes.volume_claim and _writes_checkpoints(f)),
    Rule(id="K8S-RESERVED-ENV", severity="error", stage="plan",
         when="launch.env sets a variable the operator sets on every node (PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK, PET_MASTER_ADDR, "
              "PET_MASTER_PORT, MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK)",
         why="Kubeflow Trainer rejects a TrainJob whose trainer.env sets torchrun's reserved PET_* variables, and the training-operator "
             "appends its own values after the spec's, so the pod would hold two values for one name.",
         fix="delete that key from launch.env: the node count and processes come from distributed.nodes and distributed.procs_per_node",
         condition=lambda f: _k8s(f) and bool(_k8s_reserved_env(f)),
         detail=lambda f: "launch.env sets " + ", ".join(_k8s_reserved_env(f)) + ", which the operator sets itself."),
    Rule(id="K8S-GPUS-FEWER", severity="error", stage="plan",
         when="launch.kubernetes.gpus_per_node is below distributed.procs_per_node on a GPU plan",
         why="every process of a node needs its own GPU; a pod granted fewer GPUs than processes fails at the first collective or "
             "double-books a GPU.",
         fix="set launch.kubernetes.gpus_per_node = 0 (one per process), or lower distributed.procs_per_node",
         condition=lambda f: _k8s(f) and f.plan.launch.device != "cpu"
             and 0 < f.plan.launch.kubernetes.gpus_per_node < f.plan.distributed.procs_per_node,
         detail=lambda f: f"launch.kubernetes.gpus_per_node = {f.plan.launch.kubernetes.gpus_per_node} but distributed.procs_per_node = "
                          f"{f.plan.distributed.procs_per_node}."),
    Rule(id="EFFECT-MISSING", severity="error", stage="run",
         when="after setup, before step 1: a feature the spec asks for did not take effect on the live objects (the start "
              "record's effects: compiled and checkpointed blocks, fullgraph, FSDP2's all-gather dtype, the optimizer class, "
              "offload, tensor parallel, async TP, the monitor's hooks)",
         why="a run that trains on without something its spec asked for is the silent no-op users forgive least "
             "(LlamaFactory #9500, torchtitan #3123, Accelerate #3830): fp8launch stops instead.",
         fix="set each named spec key to what this model and engine support (e.g. compile.enabled = false for a model whose "
             "repeated blocks fp8launch cannot find as model.layers), or report the gap as a bug",
         condition=lambda f: bool(f.missing_effects),
         detail=lambda f: "the spec asks for something this run did not set up: " + "; ".join(f.missing_effects) + "."),
)

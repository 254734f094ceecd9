"""launcher/profiling: a step's time in parts, from real profiler traces (torch-free).

- A recorded GPU trace (tests/data/traces/, a V100 DDP training of a CNN from HolisticTraceAnalysis's test data,
  MIT, cut to two ProfilerSteps): the parts add up to each step's device window, the cuBLAS GEMMs are high-precision
  GEMMs, the optimizer's kernels are the optimizer's.
- The rules for the kernel names an H100 FP8 step has (cuBLASLt / nvjet e4m3 GEMMs under _scaled_mm, Inductor's fused
  amax / scale / cast kernels, flash attention, NCCL), one by one.
- The layer table: a GEMM's shapes name its layer, by precision; FLOPs.
- The comparison: Amdahl's ceiling, the advice, the prediction beside the measurement, the picture.
CPU traces of real runs: tests/train/test_profiling.py; bench --profile end to end: tests/e2e/test_bench.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from launcher.profiling.compare import beside_prediction, ceiling, compare, plot, table_lines
from launcher.profiling.layers import Layer, LayerTable, gemm_flops
from launcher.profiling.parts import PARTS, Work, kernels_of, part_of
from launcher.profiling.record import run_record
from launcher.profiling.trace import Node, read_trace

GPU_TRACE = Path(__file__).parent / "data" / "traces" / "v100_ddp_resnet_2_steps.json.gz"


@pytest.fixture(scope="module")
def gpu_trace():
    return read_trace(str(GPU_TRACE))


def test_a_recorded_gpu_trace_adds_up_to_its_steps_and_names_its_parts(gpu_trace):
    assert [s.name for s in gpu_trace.steps] == ["ProfilerStep#103", "ProfilerStep#104"] and gpu_trace.on_device
    run = run_record(gpu_trace, LayerTable([]))
    assert set(run["parts"]) == set(PARTS) and run["steps"] == 2
    assert sum(run["parts"].values()) == pytest.approx(run["window_s"], rel=1e-9)  # the sweep accounts for every microsecond
    assert run["parts"]["gemm_fp8"] == 0 and run["fp8_gemm_flop_share"] == 0  # a V100 in fp32: no FP8 anywhere
    assert run["parts"]["gemm_high_precision"] > 0.01 and run["parts"]["optimizer"] > 0 and run["parts"]["idle"] > 0
    by_part: dict[str, set] = {}
    for step in gpu_trace.steps:
        for k in kernels_of(step, gpu_trace.kernels):
            by_part.setdefault(part_of(Work(tuple(k.launch.chain()), k.name)), set()).add(k.name.split("<")[0])
    assert {n for n in by_part["gemm_high_precision"] if n.startswith("volta_sgemm")}  # cuBLAS SGEMMs
    assert not any(n.startswith("volta_sgemm") for p, names in by_part.items() if p != "gemm_high_precision" for n in names)
    assert any("multi_tensor_apply" in n for n in by_part["optimizer"])  # SGD's foreach kernels under Optimizer.step#
    assert any("batch_norm" in n or "bn_" in n for n in by_part["other"])


def _chain(*names: str) -> tuple[Node, ...]:
    nodes, parent = [], None
    for name in names:
        node = Node(name, "cpu_op", 0.0, 1.0, (0, 0), {}, parent=parent)
        nodes.append(node)
        parent = node
    return tuple(nodes)


STEP = ("fp8launch.step",)
H100_KERNELS = [
    # (the chain of host events that launched it, the kernel, its part)
    ((*STEP, "aten::_scaled_mm", "cudaLaunchKernel"), "nvjet_qqtst_128x256_64x4_2x1_v_bz_coopB_TNT", "gemm_fp8"),
    ((*STEP, "aten::_scaled_mm", "cuLaunchKernelEx"), "sm90_xmma_gemm_e4m3e4m3_e4m3f32_f32_tn_n_tilesize128x128x128", "gemm_fp8"),
    ((*STEP, "aten::mm", "cudaLaunchKernel"), "nvjet_hsh_256x128_64x4_1x2_h_bz_coopA_NNT", "gemm_high_precision"),
    ((*STEP, "CompiledFunction", "cudaLaunchKernel"), "triton_red_fused__to_copy_abs_amax_clamp_mul_reciprocal_0", "fp8_cast"),
    ((*STEP, "CompiledFunction", "cudaLaunchKernel"), "triton_poi_fused__to_copy_clamp_mul_view_1", "fp8_cast"),
    ((*STEP, "CompiledFunction", "cudaLaunchKernel"), "triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_2", "other"),
    ((*STEP, "aten::_scaled_dot_product_flash_attention", "cudaLaunchKernel"),
     "pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits>", "attention"),
    ((*STEP, "FSDP::all_gather", "nccl:_all_gather_base", "cudaLaunchKernel"),
     "ncclDevKernel_AllGather_RING_LL(ncclDevComm*)", "communication"),
    ((*STEP, "fp8launch.loss", "aten::cross_entropy_loss", "cudaLaunchKernel"), "void at::native::cunn_SoftMaxForward<4>", "loss"),
    ((*STEP, "autograd::engine::evaluate_function: NllLossBackward0", "cudaLaunchKernel"),
     "void at::native::nll_loss_backward_reduce_cuda_kernel_2d", "loss"),
    ((*STEP, "fp8launch.optimizer", "Optimizer.step#AdamW.step", "cudaLaunchKernel"),
     "void multi_tensor_apply_kernel<TensorListMetadata<5>, FusedAdamMathFunctor>", "optimizer"),
    ((*STEP, "fp8launch.fp8_scales", "cudaLaunchKernel"), "void at::native::reduce_kernel<512, 1>", "fp8_cast"),
    ((*STEP, "fp8launch.data", "aten::copy_", "cudaMemcpyAsync"), "Memcpy HtoD (Pageable -> Device)", "idle"),
    ((*STEP, "matmul_with_hp_or_float8_args", "aten::abs", "cudaLaunchKernel"),
     "void at::native::vectorized_elementwise_kernel<4, AbsFunctor>", "fp8_cast"),
]


@pytest.mark.parametrize("chain,kernel,part", H100_KERNELS, ids=[k[1][:40] for k in H100_KERNELS])
def test_each_kind_of_kernel_an_fp8_step_runs_goes_to_its_part(chain, kernel, part):
    assert part_of(Work(_chain(*chain), kernel)) == part


def test_on_a_cpu_the_ops_inside_an_fp8_gemm_are_the_fp8_gemm_and_its_neighbours_are_casts():
    # torchao's eager tensorwise forward and torch's CPU _scaled_mm (which dequantizes and calls mm)
    assert part_of(Work(_chain("matmul_with_hp_or_float8_args", "aten::_scaled_mm", "aten::matmul", "aten::mm"))) == "gemm_fp8"
    assert part_of(Work(_chain("matmul_with_hp_or_float8_args", "aten::_scaled_mm", "aten::to"))) == "gemm_fp8"
    assert part_of(Work(_chain("matmul_with_hp_or_float8_args", "_ToFloat8ConstrFunc", "aten::clamp"))) == "fp8_cast"
    assert part_of(Work(_chain("mx_mmBackward", "aten::mm"))) == "gemm_fp8"  # torchao's emulated MXFP8: bf16 mm on dequantized blocks
    assert part_of(Work(_chain("aten::linear", "aten::addmm"))) == "gemm_high_precision"
    assert part_of(Work(_chain("aten::scaled_dot_product_attention", "aten::_scaled_dot_product_flash_attention_for_cpu"))) == "attention"
    assert part_of(Work(_chain("## Call CompiledFxGraph f6t ##",
                               "graph_0_cpp_fused__scaled_mm__to_copy_abs_clamp_max_mul_reciprocal_t_0"))) == "fp8_cast"


def test_a_gemm_names_its_layer_by_shape_and_precision():
    table = LayerTable([Layer("layers.0.attention.wq", 256, 256, False), Layer("layers.1.attention.wq", 256, 256, True),
                        Layer("layers.1.attention.wo", 256, 256, True), Layer("layers.0.feed_forward.w1", 256, 768, True),
                        Layer("layers.1.feed_forward.w1", 256, 768, True), Layer("output", 256, 2048, False)])
    m = 64
    for dims in ([[m, 256], [256, 768]], [[m, 768], [768, 256]], [[768, m], [m, 256]]):  # forward, input gradient, weight gradient
        assert table.label({"Input Dims": dims}, fp8=True) == "layers.*.feed_forward.w1"
        assert table.match({"Input Dims": dims}, fp8=True)[1] == (256, 768)
    assert table.label({"Input Dims": [[2048], [m, 256], [256, 2048]]}, fp8=False) == "output"  # addmm: the bias is skipped
    assert table.label({"Input Dims": [[m, 256], [256, 256]]}, fp8=False) == "layers.0.attention.wq"  # the kept one
    assert table.label({"Input Dims": [[m, 256], [256, 256]]}, fp8=True) == "layers.1.attention.wq / layers.1.attention.wo"
    assert table.label({"Input Dims": [[m, 100], [100, 7]]}, fp8=False) is None
    assert gemm_flops({"Input Dims": [[4, 16, 256], [256, 768]]}) == 2 * 4 * 16 * 256 * 768
    assert gemm_flops({"Input Dims": [[96, 128], [8, 128, 256], [8]]}) == 2 * 96 * 128 * 256  # grouped: each row through one expert
    assert table.fp8_flop_share() == pytest.approx((2 * 256 * 256 + 2 * 256 * 768) / (3 * 256 * 256 + 2 * 256 * 768 + 256 * 2048))


def _run(step: float, **parts) -> dict:
    out = dict.fromkeys(PARTS, 0.0)
    out.update(parts)
    out["idle"] += step - sum(out.values())
    return {"step_time_s": step, "parts": out, "fp8_gemm_flop_share": 0.0, "gemm_by_module": {}, "gemm_by_shape": {}, "layers": []}


def test_the_ceiling_is_amdahl_on_the_baselines_parts():
    layers = [["layers.0.w", 64, 64, False], ["layers.1.w", 64, 64, True], ["output", 64, 512, False]]
    baseline = {**_run(1.0, gemm_high_precision=0.6, attention=0.2), "gemm_by_shape": {"64,64": 0.4, "64,512": 0.2},
                "layers": [[n, k, o, False] for n, k, o, _ in layers]}
    spec = {**_run(0.8, gemm_fp8=0.2, gemm_high_precision=0.4, attention=0.2), "layers": layers, "fp8_gemm_flop_share": 0.1}
    # the spec converts 1 of the 2 (64, 64) layers: half of their 0.4 s could run at 2x
    assert ceiling(spec, baseline, 2.0) == pytest.approx(1.0 / (1.0 - 0.2 + 0.1))
    profile = compare(spec, baseline, device_name="NVIDIA H100 80GB HBM3", plan={"compile": {"enabled": True}})
    assert profile["spec"]["ceiling"] == pytest.approx(1 / 0.9, rel=1e-3) and profile["ceiling_basis"].endswith("= 2.00")  # 1979 / 989
    assert profile["measured_ratio"] == pytest.approx(1.25) and profile["of_ceiling"] == pytest.approx(1.25 * 0.9, rel=1e-3)
    profile = compare(spec, baseline, device_name="cpu", plan_gpu="B200")
    assert "B200's FP8/bf16 dense peak ratio (cpu has no FP8 peak)" in profile["ceiling_basis"]


def test_the_advice_names_what_holds_the_ratio_back_and_the_key_to_change():
    spec = _run(1.0, gemm_fp8=0.3, gemm_high_precision=0.4, fp8_cast=0.2)
    spec["gemm_by_module"] = {"output (high precision)": 0.35, "layers.0.attention.wq (high precision)": 0.05, "layers.*.w1 (fp8)": 0.3}
    lines = compare(spec, _run(1.2, gemm_high_precision=1.0), device_name="cpu", plan={"compile": {"enabled": False}})["advice"]
    assert lines[0].startswith("the bf16 output layer (lm_head) is 35% of the step: precision.keep_first_last = false")
    assert lines[1].startswith("FP8 scaling and casts are 20% of the step: compile.enabled = true fuses them")
    compiled = compare(spec, _run(1.2, gemm_high_precision=1.0), device_name="cpu", plan={"compile": {"enabled": True}})["advice"]
    assert compiled[1] == "FP8 scaling and casts are 20% of the step"  # no fix that is already set


def test_the_prediction_stands_beside_the_measured_parts_and_misses_over_25_percent_are_named():
    spec = _run(1.0, gemm_fp8=0.3, gemm_high_precision=0.1, attention=0.3, loss=0.05)
    prediction = {"gpu": "h100", "breakdown_s": {"plan": {"linear_gemms": 0.38, "recompute": 0.0, "attention": 0.1, "loss": 0.05,
                                                          "fp8_casts": 0.0, "optimizer": 0.0, "exposed_comm": 0.0, "elementwise": 0.0}}}
    got = beside_prediction(spec, prediction, "NVIDIA H100 80GB HBM3")
    assert got["compared"] and got["parts"]["gemm"] == {"measured_s": pytest.approx(0.4), "predicted_s": 0.38}
    assert got["differ"] == ["attention"]  # 0.3 measured vs 0.1 predicted; gemm is 5% off, loss exact
    assert not beside_prediction(spec, prediction, "cpu")["compared"]  # predicted for an H100: not compared on a CPU


def test_bench_lines_and_the_picture(tmp_path):
    base = _run(1.0, gemm_high_precision=0.6)
    spec = {**_run(0.7, gemm_fp8=0.3), "fp8_gemm_flop_share": 0.8}
    profile = compare(spec, base, device_name="NVIDIA H100 80GB HBM3")
    text = "\n".join(table_lines(profile))
    assert "FP8 GEMM FLOP share" in text and "80.0%" in text and "ceiling (Amdahl)" in text
    path = plot(profile, str(tmp_path / "profile.png"))
    assert Path(path).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    json.dumps(profile)  # profile.json holds it as it is

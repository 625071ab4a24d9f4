"""`trainprof ncu` without a GPU: a details page recorded on an H200 (tests/fixtures/ncu) parsed
into throughput, occupancy and rule hints, joined to a run's kernel table, and the command line
that would collect it."""

from __future__ import annotations

import json

import pytest

from trainprof.analysis.kernels import KernelTime
from trainprof.cli import main
from trainprof.ncu import join, kernel_base_name, kernel_regex, ncu_command, parse_details_csv


@pytest.fixture(scope="module")
def recorded(fixtures_dir) -> str:
    return (fixtures_dir / "ncu" / "fused_llama_loop.h200.csv").read_text()


def test_kernel_function_names():
    trace_name = (
        "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float>(int, float*)"
    )
    assert kernel_base_name(trace_name) == "vectorized_layer_norm_kernel"
    assert kernel_base_name("void cutlass::Kernel2<cutlass_80_tensorop<x>>(Params)") == "Kernel2"
    assert kernel_base_name("triton_per_fused_add_0") == "triton_per_fused_add_0"
    assert kernel_regex(["triton_poi_a", "void f<int>(int)", "triton_poi_a"]) == "regex:^(f|triton_poi_a)$"


def test_the_recorded_details_page(recorded):
    kernels = {
        kernel.name: kernel for kernel in parse_details_csv("==PROF== a line of a live run\n" + recorded)
    }
    assert {name: kernel.launches for name, kernel in kernels.items()} == {
        "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT": 11,
        "nvjet_sm90_tst_128x128_64x6_2x1_v_bz_splitK_NNT": 3,
        "nvjet_sm90_tst_128x256_64x4_2x1_v_bz_coopA_NTN": 2,
        "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT": 2,
    }
    split_k = kernels["nvjet_sm90_tst_128x128_64x6_2x1_v_bz_splitK_NNT"]
    assert (split_k.memory_pct, split_k.compute_pct, split_k.achieved_occupancy_pct) == (
        63.083,
        82.537,
        13.87,
    )
    assert split_k.duration_us == 43.584  # ns in the page, averaged over 3 launches
    assert split_k.block_size == "(384, 1, 1)"
    hints = {hint.rule: hint for hint in split_k.hints}
    assert set(hints) == {"TheoreticalOccupancy", "CPIStall", "LaunchConfiguration"}
    assert hints["CPIStall"].type == "OPT" and hints["CPIStall"].estimated_speedup_pct == 51.44
    assert "scoreboard" in hints["CPIStall"].description
    assert [hint.rule for hint in split_k.hints][0] == "TheoreticalOccupancy"  # largest estimate first


def test_join_puts_the_figures_beside_the_run_kernels(recorded):
    table = [
        KernelTime(
            name="nvjet_sm90_tst_128x128_64x6_2x1_v_bz_splitK_NNT",
            count=24,
            total_ms=2.1,
            mean_us=87.5,
            pct=5.7,
        ),
        KernelTime(
            name="void at::native::multi_tensor_apply_kernel<T>(T)",
            count=21,
            total_ms=4.3,
            mean_us=205.0,
            pct=11.7,
        ),
    ]
    rows = join(table, parse_details_csv(recorded))
    assert [(row.kernel, row.pct, row.ncu is not None) for row in rows] == [
        (table[0].name, 5.7, True),
        (table[1].name, 11.7, False),  # no launch of it within the launch count
    ]
    assert rows[0].ncu.compute_pct == 82.537


def test_the_command_line(tmp_path, fixtures_dir, recorded, capsys):
    line = ncu_command(["python", "train.py"], ["void f<int>(int)"], tmp_path / "r", 20, 6)
    assert line[:3] == ["ncu", "--clock-control", "none"]
    assert line[line.index("--kernel-name") + 1] == "regex:^(f)$" and line[-2:] == ["python", "train.py"]
    assert line[line.index("--launch-skip") + 1 : line.index("--launch-count") + 2] == [
        "20",
        "--launch-count",
        "6",
    ]
    run = str(fixtures_dir / "traces" / "gpt2_clean")
    assert main(["ncu", "--top", "3", "--dry-run", run, "--", "python", "train.py", "--lr", "1"]) == 0
    printed = capsys.readouterr().out
    assert "--launch-count 9" in printed and printed.strip().endswith("python train.py --lr 1")
    saved = tmp_path / "page.csv"
    saved.write_text(recorded)
    assert main(["ncu", "--top", "2", "--json", "--csv", str(saved), run]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 2 and all(row["ncu"] is None for row in rows)  # other kernels than the page's
    saved.write_text("no header here\n")
    assert main(["ncu", "--csv", str(saved), run]) == 2
    assert "no ncu details page" in capsys.readouterr().err

"""The one sanitiser (trainprof.report.text) and short kernel names (trainprof.report.names)."""

from __future__ import annotations

import json
import sys
import time
import unicodedata

import pytest

from trainprof.report.names import short_kernel_names, short_names
from trainprof.report.text import cell_width, escape_unsafe_json, safe_text, wrap

# Every character class the sanitiser must keep off a terminal, one example each.
HOSTILE_CHARS = {
    "ESC": "\x1b", "CSI (C1)": "\x9b", "NEL": "\x85", "BEL": "\x07", "CR": "\r", "DEL": "\x7f",
    "arabic letter mark": "\u061c", "line separator": "\u2028", "paragraph separator": "\u2029",
    "right-to-left override": "\u202e", "left-to-right isolate": "\u2066", "zero-width space": "\u200b",
    "BOM": "\ufeff", "tag": "\U000e0041",
    # Letters that draw nothing: a name of them looks blank (or like another one)
    "Hangul filler": "\u3164", "Hangul choseong filler": "\u115f", "Hangul jungseong filler": "\u1160",
    "halfwidth Hangul filler": "\uffa0",
}


def test_every_control_format_and_separator_character_is_unsafe():
    """The hand-written character class covers every Cc, Cf, Cs, Zl and Zp code point."""
    missed = [
        f"U+{code:04X}"
        for code in range(sys.maxunicode + 1)
        if unicodedata.category(chr(code)) in ("Cc", "Cf", "Cs", "Zl", "Zp")
        and safe_text(f"a{chr(code)}b") not in ("ab", "a b")
    ]
    assert not missed


@pytest.mark.parametrize("name", HOSTILE_CHARS)
def test_safe_text_drops_or_spaces_each_hostile_character(name):
    char = HOSTILE_CHARS[name]
    assert char not in safe_text(f"gemm{char}[/x]{char}kernel")
    assert "[/x]" in safe_text(f"gemm{char}[/x]")  # markup-looking text stays text


def test_combining_marks_stack_at_most_two_deep():
    """Dozens of combining marks on one letter ("Zalgo" text) drew streaks over the lines above and
    below in report.html and the console (issue #33): at most `MAX_COMBINING_MARKS` stay on a base."""
    zalgo = "gemm" + "\u0301\u0316\u0334" * 30 + "_kernel"
    shown = safe_text(zalgo)
    assert shown == "gemm\u0301\u0316_kernel"
    vietnamese = unicodedata.normalize("NFD", "Nguyễn Thị Kiều")  # two marks on a letter: kept
    assert safe_text(vietnamese) == vietnamese
    assert safe_text("a" + "\u0300" * 10**6, 50) == "a\u0300\u0300…"  # cut, then capped


def test_line_breaks_become_spaces_and_text_is_one_line():
    assert safe_text("a\nb\u2028c\u2029d\x85e\r\nf") == "a b c d e  f"


def test_json_escapes_keep_the_data():
    text = "".join(HOSTILE_CHARS.values())
    encoded = escape_unsafe_json(json.dumps(text, ensure_ascii=False))
    assert not any(char in encoded for char in HOSTILE_CHARS.values())
    assert json.loads(encoded) == text


def test_cut_costs_what_the_limit_allows_not_what_the_input_holds():
    huge = "x" * 50_000_000
    start = time.process_time()
    shown = safe_text(huge, 100)
    assert time.process_time() - start < 0.05
    assert len(shown) == 100 and shown.endswith("…")


def test_wrap_never_exceeds_the_width_and_keeps_every_character():
    text = "word " * 30 + "x" * 200 + " 漢字漢字漢字漢字漢字漢字漢字漢字漢字漢字漢字漢字漢字漢字漢字漢字"
    for width in (10, 33, 80):
        lines = wrap(text, width, first_indent="  1. ", indent="     ")
        assert all(cell_width(line) <= width for line in lines)
        assert "".join(line.strip().replace("1.", "", 1) if i == 0 else line.strip()
                       for i, line in enumerate(lines)).replace(" ", "") == text.replace(" ", "")


# -- kernel names ----------------------------------------------------------------------------------

ELEMENTWISE = (
    "void at::native::unrolled_elementwise_kernel<"
    "at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)"
    "::{lambda()#3}::operator()() const::{lambda()#7}::operator()() const::{lambda(%s)#1}, std::array<char*, "
    "2ul>, 4, TrivialOffsetCalculator<1, unsigned int>, TrivialOffsetCalculator<1, unsigned int>, "
    "at::native::memory::LoadWithCast<1>, at::native::memory::StoreWithCast<1> >(int, %s)"
)


def test_kernel_names_by_structure():
    names = [
        "std::enable_if<(((8)>(0)))&&vllm::_typeConvert<c10::BFloat16>::exists, void>::type "
        "vllm::fused_add_rms_norm_kernel<c10::BFloat16, 8>(c10::BFloat16*, long, c10::BFloat16*, float, int)",
        "ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)",
        "void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x2_tn_align8>"
        "(cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x2_tn_align8::Params)",
        "void at::native::(anonymous namespace)::cunn_SoftMaxForwardReg<float, float, float, "
        "at::native::(anonymous namespace)::LogSoftMaxForwardEpilogue, long, 8>(float*, float const*, long)",
        "_ZN2ck16tensor_operation6device37kernel_batched_gemm_xdlops_bwd_weightINS_47GridwiseGemmE",
        "Memcpy HtoD (Pageable -> Device)",
        "triton_poi_fused_add_0",
    ]
    shown = short_kernel_names(names, 60)
    assert shown[2].startswith("Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm") and len(shown[2]) == 60
    assert shown[:2] + shown[3:] == [
        "fused_add_rms_norm_kernel",
        "ncclDevKernel_Generic",
        "cunn_SoftMaxForwardReg",
        "kernel_batched_gemm_xdlops_bwd_weight",
        "Memcpy HtoD (Pageable -> Device)",
        "triton_poi_fused_add_0",
    ]


def test_kernels_that_shorten_alike_are_told_apart():
    names = [ELEMENTWISE % (dtype, dtype) for dtype in ("float", "c10::BFloat16", "int")]
    shown = short_kernel_names(names, 60)
    assert len(set(shown)) == 3 and all(len(name) <= 60 for name in shown)
    assert all("unrolled_elementwise_kernel" in name for name in shown)
    assert short_kernel_names([names[0]], 60) == ["unrolled_elementwise_kernel"]  # alone: the short name


def test_cut_names_stay_distinct():
    names = ["GPT2Attention", "GPT2Attention/Conv1D", "a" * 80 + "x", "a" * 80 + "y", "same\x1b", "same"]
    shown = short_names(names, 40)
    assert len(set(shown)) == len(names) and all(len(name) <= 40 + len(" #2") for name in shown)
    assert shown[:2] == ["GPT2Attention", "GPT2Attention/Conv1D"]


def test_clean_all_is_clean_of_each_and_passes_printable_ascii_through():
    from trainprof.report._format import clean, clean_all

    plain = ["aten::mm", "ProfilerStep#3", "x" * 10]
    assert clean_all(plain) == plain
    odd = ["ok", "bidi\u202eover\x1b[2J", "long" * 100]
    assert clean_all(odd) == [clean(value) for value in odd]
    assert clean_all(odd, 12)[2] == clean("long" * 100, 12)
    assert clean_all([]) == []

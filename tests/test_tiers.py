"""The slow tier of tests/conftest.py names modules and test functions that exist, and marks them."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

from conftest import SLOW_MODULES, SLOW_TESTS, pytest_collection_modifyitems, pytest_ignore_collect

TESTS = Path(__file__).resolve().parent


def test_every_slow_module_and_function_exists():
    assert all((TESTS / module).is_file() for module in SLOW_MODULES)
    for name in SLOW_TESTS:
        module, function = name.split("::")
        assert module not in SLOW_MODULES, name  # already slow as a whole
        assert re.search(rf"^def {function}\(", (TESTS / module).read_text(), re.M), name


def _item(module: str, function: str, params: str = "") -> SimpleNamespace:
    item = SimpleNamespace(path=TESTS / module, originalname=function, name=function + params, marks=[])
    item.add_marker = item.marks.append
    return item


def test_the_listed_modules_and_functions_are_marked_slow_and_no_other():
    items = [
        _item("test_ops.py", "test_anything", "[float32]"),  # a slow module
        _item("test_quiet.py", "test_quiet_run_silences_trainprofs_warnings_and_report"),
        _item("test_true_numbers.py", "test_no_printed_efficiency_passes_100_percent", "[17]"),
        _item("test_quiet.py", "test_quiet_run_silences_trainprofs_warnings"),  # a prefix only: fast
        _item("test_tiers.py", "test_the_listed_modules_and_functions_are_marked_slow_and_no_other"),
    ]
    pytest_collection_modifyitems(items)
    assert [[mark.name for mark in item.marks] for item in items] == [["slow"], ["slow"], ["slow"], [], []]


def test_this_module_is_in_the_fast_tier(request):
    assert request.node.get_closest_marker("slow") is None


def test_only_the_fast_tier_leaves_slow_modules_uncollected():
    def config(markexpr: str) -> SimpleNamespace:
        return SimpleNamespace(getoption=lambda name: markexpr if name == "markexpr" else None)

    assert pytest_ignore_collect(TESTS / "test_ops.py", config("not slow")) is True
    assert pytest_ignore_collect(TESTS / "test_ops.py", config("")) is None  # `make test`
    assert pytest_ignore_collect(TESTS / "test_ops.py", config("slow")) is None
    assert pytest_ignore_collect(TESTS / "test_tiers.py", config("not slow")) is None

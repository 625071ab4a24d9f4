"""Sync-site capture without CUDA: frame selection, explicit-sync wrappers, the warning hook."""

from __future__ import annotations

import sys
import warnings

import torch

from trainprof.capture.syncs import SyncCapture, innermost_user_frame, is_library_file

SITE = "/usr/lib/python3.11/site-packages"


def test_innermost_user_frame_skips_library_frames():
    stack = [
        ("/home/me/train.py", 80, "<module>"),
        ("/home/me/train.py", 45, "train"),
        (f"{SITE}/transformers/trainer.py", 2100, "training_step"),
        (f"{SITE}/torch/_tensor.py", 500, "item"),
        ("<frozen importlib._bootstrap>", 1, "_call"),
    ]
    assert innermost_user_frame(stack) == ("/home/me/train.py", 45, "train")
    assert innermost_user_frame(stack[2:]) is None


def test_library_files():
    assert is_library_file(torch.__file__)
    assert is_library_file(warnings.__file__)
    assert is_library_file(f"{SITE}/accelerate/accelerator.py")
    assert is_library_file("<frozen runpy>")
    assert not is_library_file(__file__)
    import trainprof.demo

    assert is_library_file(sys.modules["trainprof.session"].__file__)
    assert not is_library_file(trainprof.demo.__file__)  # the demo's loop is user code


def test_explicit_wrapper_records_site_only_when_active():
    capture = SyncCapture()
    calls = []
    wrapped = capture._explicit_wrapper("torch.cuda.synchronize", lambda: calls.append(1))
    wrapped()
    assert capture.sites == [] and calls == [1]
    capture.active, capture.step_num = True, 7
    line = sys._getframe().f_lineno + 1
    wrapped()
    (site,) = capture.take_sites()
    assert (site.step, site.call, site.file, site.line) == (7, "torch.cuda.synchronize", __file__, line)
    assert site.function == "test_explicit_wrapper_records_site_only_when_active"
    assert site.to_dict()["stack"][-1] == {"file": __file__, "line": line, "function": site.function}
    assert capture.sites == []


def test_activate_patches_and_deactivate_restores():
    original_sync, original_show = torch.cuda.synchronize, warnings.showwarning
    filters = list(warnings.filters)
    capture = SyncCapture()
    capture.activate(step_num=4)
    try:
        assert torch.cuda.synchronize.__wrapped__ is original_sync
        line = sys._getframe().f_lineno + 1
        warnings.warn("called a synchronizing CUDA operation (Triggered)", UserWarning, stacklevel=1)
        with warnings.catch_warnings(record=True) as others:
            warnings.simplefilter("always")
            warnings.warn("something else", UserWarning, stacklevel=1)
        assert len(others) == 1  # other warnings are not swallowed
    finally:
        capture.deactivate()
    assert torch.cuda.synchronize is original_sync and warnings.showwarning is original_show
    assert warnings.filters == filters
    (site,) = capture.take_sites()
    assert (site.step, site.call, site.line, site.file) == (4, "implicit", line, __file__)
    capture.deactivate()  # idempotent


# -- a failure inside a hook never reaches the user's call (#9) --------------------------------


def _failing_stack(*args, **kwargs):
    raise RuntimeError("stack walk failed")


def test_failing_explicit_hook_steps_aside_and_the_call_goes_on(monkeypatch):
    capture = SyncCapture()
    capture.active, capture.step_num = True, 3
    calls = []
    wrapped = capture._explicit_wrapper("torch.cuda.synchronize", lambda x: calls.append(x) or x * 2)
    monkeypatch.setattr("trainprof.capture.syncs.current_stack", _failing_stack)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert wrapped(21) == 42  # the user's call ran and returned its value
        assert wrapped(1) == 2
    assert calls == [21, 1]
    assert capture.failed and not capture.active and capture.sites == []
    assert [str(w.message) for w in caught if "trainprof" in str(w.message)] == [
        "trainprof: capturing sync call sites failed (RuntimeError: stack walk failed); "
        "sync lines are not recorded from here on, training goes on"
    ]  # once
    capture.activate(step_num=4)  # a later window: the failed capture stays off
    try:
        assert not capture.active
    finally:
        capture.deactivate()


def test_failing_warning_hook_swallows_the_sync_warning_even_under_warnings_as_errors(monkeypatch):
    capture = SyncCapture()
    capture.activate(step_num=2)
    try:
        monkeypatch.setattr("trainprof.capture.syncs.current_stack", _failing_stack)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # `python -W error`: trainprof's own warning must not raise
            hook = warnings.showwarning
            hook("called a synchronizing CUDA operation (Triggered)", UserWarning, __file__, 1)
            hook("called a synchronizing CUDA operation (Triggered)", UserWarning, __file__, 2)
        assert capture.failed and capture.take_sites() == []
    finally:
        capture.deactivate()


def test_capture_judges_frames_with_this_process_layout():
    capture = SyncCapture()
    capture.activate(step_num=1)
    capture.deactivate()
    assert capture.layout is not None and "torch" in capture.layout.library_packages
    site = capture.record(
        "implicit",
        [
            ("/code/train.py", 30, "main"),  # user code, although `code` is a stdlib module name
            (f"{SITE}/lightning_utilities/core/apply_func.py", 29, "apply_to_collection"),
            (f"{SITE}/lightning/fabric/utilities/apply_func.py", 129, "to_item"),
        ],
    )
    assert (site.file, site.line, site.function) == ("/code/train.py", 30, "main")


def test_session_records_the_code_layout_beside_the_sync_sites(tmp_path):
    import json

    import trainprof
    from trainprof.trace import load_traces

    model = torch.nn.Linear(8, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with trainprof.session(log_dir=tmp_path, run_name="layout", wait=0, warmup=1, active=1,
                           record_shapes=False, profile_memory=False, analyze=False, console=False) as sess:
        for _ in range(3):
            model(torch.randn(4, 8)).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
    (sites_file,) = sess.run_dir.glob("*.syncsites.json")
    document = json.loads(sites_file.read_text())
    assert document["version"] == 2 and document["sites"] == []  # nothing synchronizes on the CPU
    assert "torch" in document["code_layout"]["library_packages"]
    (trace,) = load_traces(sess.run_dir)
    assert trace.code_layout is not None and trace.code_layout.version_of("torch") == torch.__version__

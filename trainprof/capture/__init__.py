"""What must be caught while the loop runs: the call sites of synchronizing calls."""

from trainprof.capture.syncs import SyncCapture, SyncSite, innermost_user_frame, is_library_file

__all__ = ["SyncCapture", "SyncSite", "innermost_user_frame", "is_library_file"]

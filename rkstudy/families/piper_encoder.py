"""Piper duration encoder on the NPU (issue: fixed-width slices, the relative-shift rewrite, the ladder)."""


def add_cli(piper_sub) -> None:
    """Register `rkstudy piper encoder`."""

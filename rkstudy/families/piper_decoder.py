"""Piper (VITS) decoder on the NPU."""


def add_cli(piper_sub) -> None:
    """Register `rkstudy piper decoder`."""

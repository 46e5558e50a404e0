"""rkstudy: single TTS stages on Rockchip NPUs, measured off-board with the real compiler and simulator."""

__version__ = "0.1.0"

"""Test double of rknn-toolkit-lite2 (see tests/doubles/README.md). Not the real runtime."""

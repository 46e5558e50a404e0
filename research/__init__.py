"""Research scripts: how a design choice was made, kept runnable (each has a smoke test in tests/test_research.py).

Nothing here writes a committed table; their outputs stay under build/.
"""

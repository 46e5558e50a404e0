"""Reading what rknn-toolkit2 (the host compiler and PC simulator) prints and writes.

log.py: its build log (ANSI colour, REGTASK lines, the layer table, the memory plan) and its
accuracy-analysis report. Nothing here imports the toolkit, onnx or torch: a log can be read on
any machine.
"""

"""Everything that runs on a board: reading the board's files, `rkstudy board run`, and (with the
flow-estimator study) the memory budget and the measurement kit.

Board side: imports the standard library, numpy and tqdm only (and rknnlite at call time).
"""

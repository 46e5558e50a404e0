from rknnlite.api.rknn_lite import RKNNLite  # noqa: F401  (the real package's layout)

"""The lint rules, one small module per hazard family; importing this package registers them all.

Adding a rule: a function decorated with `rkstudy.lint.rule(code, name)` that yields
`rkstudy.lint.Hit`s, in a module listed in MODULES (or a new module added there).
"""

import importlib

MODULES = ("shape_plumbing", "fused_ops", "relshift", "trig", "mask_resize", "weight_norm", "register_field",
           "dilated_field", "unsupported", "dynamic_dims", "fp16_range")

for _module in MODULES:
    importlib.import_module(f"{__name__}.{_module}")

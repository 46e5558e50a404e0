"""Equalizing the Piper decoder window before quantizing it: does it move the stage that breaks int8?

`python -m research.equalize sim` measures it off the toolkit (rkstudy.graph.quantsim, fp32 onnxruntime);
`python -m research.equalize builds` with the toolkit on rk3588, rk3576 and rk3562, scored in the simulator.
"""

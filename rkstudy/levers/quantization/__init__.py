"""Quantization as a lever (host): every quantized dtype the toolkit offers, on every target that builds
it, calibrated on a stage's own real data and scored in the simulator against fp32 on data the
calibration never saw, by SNR and by what a listener would judge (PESQ-WB, STOI, DNSMOS), beside the
share of the stage's conv MACs that run on weights of 8 bits or fewer.

Why: the NPU is rated for int8, fp16 runs at a fraction of it, and a plain int8 build of a decoder can
lose it whole (the Piper decoder window at 6 dB against fp32). Which tensors cost it is measured, not
assumed: one calibration pass per setting (rkstudy.toolkit.simulator.QuantizationSession) serves any
number of hybrid variants, each with some of the toolkit's quantization-config tensors in float16, so
a search can re-measure fidelity after every choice instead of trusting a per-layer report.

A family supplies a Stage: its engine graph, calibration feeds from its own real data, and evaluation
items held apart from them (a few of which, `search`, steer the search; every chosen point is then
scored on them all).
"""

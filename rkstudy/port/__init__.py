"""Vocoder shapes the project was never tuned on (architectures.py), the proving ground of the generic
port path; the path itself, `rkstudy port`, is the family rkstudy.families.port."""

"""The sections of benchmarks/accelerator_suite.py: parity, the 7B-width train step, attention
kernels and engine decoding, each sized per backend (sizes.py)."""

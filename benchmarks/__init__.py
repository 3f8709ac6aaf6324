"""Benchmarks of pyvision_jax, each a module run from the repository root:
`python -m benchmarks.NAME [--help]`. Each prints its figures with the machine they ran on."""

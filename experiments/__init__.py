"""The learning experiments, above the library (they may import all of pyvision_jax, and
nothing in pyvision_jax imports them): the fixed-temperature baselines, the training-dynamics
runs and their ablations, their statistics, figures and tables, and diagnostics of what an
update moved. Each script runs from the repository root: `python -m experiments.NAME`."""

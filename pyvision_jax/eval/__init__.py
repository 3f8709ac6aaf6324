"""Benchmark evaluation: the run (``evaluate``) from a config (``pipeline``), the policy to
evaluate (``policy``), the evaluation directory's files (``records``), metrics (``metrics``)
and the HTML trajectory viewer (``report``)."""

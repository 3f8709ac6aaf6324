"""Benchmark evaluation (``evaluate``), its metrics (``metrics``), checkpoint loading
(``checkpoints``) and the HTML trajectory viewer (``report``)."""

"""What a run logs, below both the trainer and evaluation: TensorBoard scalars (their tag
names in metric_names, the synchronous writer in metrics over event_file) and the
append-only outputs made consistent with the step a run resumes from (run_outputs)."""

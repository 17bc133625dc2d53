"""A run's folder: checkpoints, result.json, report.md, the reporter's
lines and TensorBoard events, locks and atomic writes."""

"""The training run: an explicit loop (loop.py) with named hooks (hooks.py) for MLPerf logging
(mllog.py) and progress lines (progress.py); LR schedule, evaluation, checkpoints, failure
handling in their own modules."""

"""What run_and_time.sh needs from a config (task counts, seeds, environment) and the checks it
runs around training (placement pre-flight, compliance of each result log)."""
from .plan import LaunchPlan, launch_plan, shell_assignments

__all__ = ["LaunchPlan", "launch_plan", "shell_assignments"]

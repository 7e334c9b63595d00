"""The planner's proof on CPU (bench/planner_vs_measured.py): the proof file read (spec.py), the
summaries folder written (summaries.py), the table derived from it (derive.py) and printed
(render.py), committed folders checked against their re-derivation (rederive.py)."""

"""`profile`: a measured step breakdown of a run, next to the planner's prediction
(docs/profile.md). One module per concern: trace (reading Chrome traces), intervals (the
arithmetic), attribution (what an event is: compute category, process group), analysis (one
rank's steps), straggler, report (table, JSON, plot), capture (the run driver), marker (the
folder's not-an-MLPerf-run mark)."""

# fold_console.awk: the console of a run as run_and_time.sh shows it (console_<i>.txt keeps every
# line). Folded, with one closing note naming the file (-v file=...):
#   - Python tracebacks: their frames; the exception line is kept, except torchrun's
#     ChildFailedError (with its report block) and SignalException, which the outcome line
#     reports (launch/launcher_report.py);
#   - C++ frames (`frame #N: ...`, `Exception raised from ... (most recent call first):`), which
#     torch puts into the message of a failed collective or store call (c10::DistNetworkError);
#   - a "[rankN]: " prefix is looked through.
# Every line printed is flushed at once (a live console).
function out(s) { print s; fflush() }
{ line = $0; sub(/^\[rank[0-9]+\]: ?/, "", line) }
block { folded++; if (line ~ /^=+$/ && ++rules == 2) block = 0; next }
line ~ /^Traceback \(most recent call last\):/ { tb = 1; folded++; next }
line ~ /^(During handling of the above exception|The above exception was the direct cause)/ \
  { folded++; next }
tb && (line ~ /^[ \t]/ || line == "") { folded++; next }
line ~ /^(frame #[0-9]+: |Exception raised from .*\(most recent call first\):$)/ \
  { folded++; next }
{ tb = 0 }
line ~ /^[A-Za-z_.]*ChildFailedError: *$/ { block = 1; rules = 0; folded++; next }
line ~ /^[A-Za-z_.]*SignalException: Process [0-9]+ got signal: / { folded++; next }
{ out($0) }
END {
  if (folded) out("[run_and_time] " folded " line(s) of tracebacks and C++ frames folded" \
                  " here: every line is in " file)
}

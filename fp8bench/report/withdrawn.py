"""The speedups the committed samples cannot rebuild (fp8bench.analysis.rebuild.withdrawn), which every page
withdraws: per run, workload and reason, how many of the run's stored speedups (`fp8bench report --markdown
withdrawn`; `fp8bench audit --verbose` lists each one)."""

from __future__ import annotations

from collections import Counter

from fp8bench.analysis.rebuild import SPEEDUPS, withdrawn
from fp8bench.core.markdown import table


def markdown(con) -> str:
    gone = withdrawn(con)
    if not gone:
        return "Every stored speedup is rebuilt from the committed samples.\n"
    stored = Counter()
    workload, version = {}, {}
    for run_id, case_id, wl, v in con.execute(
            "SELECT m.run_id, m.case_id, c.workload, r.measurement_version FROM measurements m "
            "JOIN cases c USING (run_id, case_id) JOIN runs r USING (run_id) "
            "WHERE m.metric IN (SELECT unnest(?::VARCHAR[])) AND m.value IS NOT NULL", [list(SPEEDUPS)]).fetchall():
        stored[(run_id, wl)] += 1
        workload[(run_id, case_id)], version[run_id] = wl, v
    rows = Counter((run_id, workload[(run_id, case_id)], why) for (run_id, case_id, _), why in gone.items())
    return table(["run", "measurement version", "workload", "speedups withdrawn", "of the run's", "why"],
                 [[f"`{run_id}`", "" if version[run_id] is None else f"v{version[run_id]}", wl, n,
                   stored[(run_id, wl)], why] for (run_id, wl, why), n in sorted(rows.items())])

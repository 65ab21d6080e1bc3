"""``fiomon compare``: two runs' percentiles side by side over aligned time, with verdicts.

- :mod:`.model`: the options and results (pure data; the contract of the writers and pages).
- :mod:`.windows`: one run's fio output read into aligned windows of merged histograms.
- :mod:`.stats`: the ratio's interval (MOVER on the order-statistic bounds; a paired block
  bootstrap over windows for whole-run lines) and per-host attribution (pure numpy).
- :mod:`.run`: both runs read, aligned and judged (:func:`.run.run_compare`).
- :mod:`.output`: table, jsonl and csv; :mod:`.page`: the HTML page and the PNG/SVG figure.
"""

"""The debug dumps (README, "Debug dumps" and "Online compare").

Each mode is a small module with one job; the recorder and the capture front-ends
call into them, nothing here imports a front-end.

* :mod:`.sample`           ``sample_mode`` 1: the first ``sample_num`` elements of each tensor
* :mod:`.origin`           the first-overflow rule (shared with ``opdump overflow``)
* :mod:`.overflow`         ``op_debug_mode`` 3: the overflow watch (eager operators);
  :mod:`.overflow_graph` its taps in a compiled graph's op-by-op path;
  :mod:`.overflow_summary` the per-iteration ``overflow.json``/``overflow.csv``;
  :mod:`.overflow_rules` which operators are spared a reduction or a pre-write copy;
  :mod:`.overflow_copies` the pooled pre-write copies; :mod:`.overflow_now` CPU operators
  read and judged as they return (:mod:`.overflow_values` the reading);
  :mod:`.overflow_batch` the held flags of operators on other devices
* :mod:`.exception`        ``op_debug_mode`` 4: an operator that raises has its inputs saved;
  :mod:`.repro` writes its ``repro_<op>.py``; :mod:`.exception_records` reads the records back
* :mod:`.watcher`          watcher mode (``dump_scene: "watcher"``): the first operator after
  which a watched output changed; :mod:`.watcher_graph` its graph-mode taps
* :mod:`.online_compare`   ``opdump_settings.reference``: statistics judged against a reference
  dump while the run goes on; :mod:`.reference` reads that dump lazily
"""

"""Serverless handlers (docs/architecture/design.md §7): thin entry points that validate their event
with pydantic, call into tabletstore and answer JSON (``functions._common.handle``).

* ``log_sort.handler``: one sort task of a dead worker's commit log (§6), invoked by
  ``tabletstore.master.sort_lambda.LambdaSortExecutor``;
* ``compaction.handler``: a major compaction of one tablet, adopted by its serving worker
  (§5.4), invoked by ``tabletstore.master.compaction_lambda.LambdaCompactionExecutor``;
* ``gc.handler``: one garbage-collection round of a cluster's bucket (§5.2).
"""

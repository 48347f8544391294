"""Serverless handlers (DESIGN.md §7): thin entry points that validate their event with
pydantic and call into tabletstore. The recovery-sort handler (sorting a dead worker's log
segments into per-tablet runs, §6) lands with the parallel-recovery work."""

"""The chaos harness, Jepsen-style: workload, nemesis, checker.

Real processes (etcd, one member or three; moto's S3 server or SeaweedFS behind a
fault-injecting proxy; masters, workers) run a
workload of writers and readers that record every operation with its outcome
(:mod:`.history`, :mod:`.workload`); a nemesis applies a seeded schedule of faults - worker and
master SIGKILLs, etcd restarts, a worker paused past its lease, S3 paused, S3 errors and a
minute-long 503 storm, partitions (:mod:`.netproxy`), a worker's wall clock stepped, etcd's
leader killed, its quorum lost and a member replaced (:mod:`.nemesis`, :mod:`.chaos_cluster`,
:mod:`.s3proxy`); the checker, a pure function of the
history, finds lost acknowledged writes, values never written, cells read after their
acknowledged delete, and tablets served by two workers at once (:mod:`.checker`), and checks
every cell's operations, single-row transactions included, for linearizability
(:mod:`.linearizability`); with ``--changes`` a follower reads the table's change stream
through the run and every acknowledged write must be in it exactly once (:mod:`.change_follower`);
the masters' logs say how much their garbage collection deleted meanwhile (:mod:`.collection_log`).
:func:`.runner.run_chaos` runs it all; ``python -m bench.chaos`` is the command line and
``tests/chaos`` the short run in the suite.
"""

"""noisescope's reliability and security harness: ``python -m reliability``.

Load (N client processes through the real client), faults (server SIGKILL, PostgreSQL restart,
read-only spool, client SIGKILL + ``noisescope sync``), bad input (hostile corpus, schemathesis,
hypothesis), isolation/auth and dashboard XSS, all against real processes on 127.0.0.1, with
reconciliation by SQL. Writes ``docs/reliability.md``; CI-sized checks in tests/reliability.
"""

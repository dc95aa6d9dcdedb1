"""The worker's batch logic, one module per phase: FIFO partial-batch semantics per workspace group, on top of
the guard.

Per record, in order, per message group: parse and validate (bad → REJECTED + workspace halted, acknowledged);
claim (one conditional write that also checks the workspace is not halted; halted → PARKED, acknowledged); run the
job; complete. A retryable failure stops the rest of its group (Powertools' SqsFifoPartialProcessor with
skip_group_on_error) while other groups go on; the failed record and the rest of its group get a shortened
visibility (backoff) and are reported in batchItemFailures. Nothing is raised out of the handler for one record.

The message groups of one batch run at once, each on a thread of a bounded pool (GROUP_CONCURRENCY; 1 runs the batch
as one sequential loop), each group's records in order under its own SqsFifoPartialProcessor; the failures are merged
and reported in the event's order, and parking near the delivery limit and backoff run after all groups.

An invocation that dies (killed, out of memory, timed out) takes every job it had in flight with it, so a job whose
last claim never came back from a shared invocation is only a suspect: it may have killed it, or another job may
have. Such a job (SUSPECT) and the rest of its group wait until the groups running at once are done, and then run
alone, one group at a time, those that only shared a dead invocation before those that died alone. Only a job that
dies alone is blamed (see `JobGuard.claim`), so a job that kills every invocation never makes the jobs of other
workspaces it shared batches with DEAD.

Once a job is claimed, and before it runs, the worker checks that the jobs its workspace accepted ahead of it are
settled (`JobGuard.jobs_ahead`): if the queue let one of them go unsettled (dead-lettered), this job would
take effect before it, so the workspace is halted naming them and this job is parked behind them.

A drain marker (message attribute type=drain, sent by a resume into the workspace's own group) is recognised before
any job parsing and is never rejected: it runs the workspace's PARKED jobs in SequenceNumber order through the same
claim/run/complete path, a bounded number per marker, then sends the next marker or makes the workspace ACTIVE.
"""

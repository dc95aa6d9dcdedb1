"""The store: the only code that reads and writes job and workspace records in DynamoDB.

Every transition is one conditional write (a single item, or one transaction when a job and its workspace must change
together), allowed by the core's transition table (`agent_jobs.core.transitions`). A lost condition is an expected
outcome returned as a value, never an exception: the core says what it means (`agent_jobs.core.decisions`) and the
caller decides whether to acknowledge or retry. The happy path is two writes (claim, complete) and one Query of the
sparse pending index (`jobs_ahead`, an empty range unless jobs went missing); a duplicate delivery is one
failed conditional write.

The parts, by concern: `acceptance` (the API records jobs), `leases` (claim, complete, fail), `halts` and `rejects`
(a workspace halted, a job parked or rejected), `resume` (an operator's decision), `drain` (the resume runs the parked
jobs), `queries` (reads). `codec` is the wire format, `conditions` the named expression fragments.
"""

from __future__ import annotations

from agent_jobs.store.acceptance import AcceptanceStore
from agent_jobs.store.leases import LeaseStore
from agent_jobs.store.rejects import RejectStore
from agent_jobs.store.resume import ResumeStore


class JobGuard(AcceptanceStore, LeaseStore, RejectStore, ResumeStore):
    """Every conditional write of job and workspace state, and the reads that go with them, in one table."""


__all__ = ["JobGuard"]

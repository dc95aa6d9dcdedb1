"""Outcomes of a job handler that are not success. Anything else a handler raises counts as retryable."""


class RetryableJobError(Exception):
    """A transient failure (network, throttling, a branch that moved): try again, up to the attempt limit."""


class OutOfTimeError(RetryableJobError):
    """The invocation had too little time left for the job (it started late, behind other jobs of its batch): a retry,
    which says nothing against the job itself. Near the queue's delivery limit its record is never parked for it."""


class PermanentJobError(Exception):
    """The job can never succeed as submitted (e.g. a patch that does not apply): DEAD, and the workspace halts."""

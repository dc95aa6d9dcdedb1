"""Outcomes of a job handler that are not success. Anything else a handler raises counts as retryable."""


class RetryableJobError(Exception):
    """A transient failure (network, throttling, a branch that moved): try again, up to the attempt limit."""


class PermanentJobError(Exception):
    """The job can never succeed as submitted (e.g. a patch that does not apply): DEAD, and the workspace halts."""

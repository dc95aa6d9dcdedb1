"""What one job of a git workspace may bring into the worker: a module of its own, so that the worker builds its limits
from its settings at a cold start without importing the git library (`jobs.git_workspace` enforces them)."""

from __future__ import annotations

from dataclasses import dataclass

from agent_jobs.settings import DEFAULT_MAX_BLOB_BYTES, DEFAULT_MAX_CHECKOUT_BYTES, DEFAULT_MAX_FETCH_BYTES, Settings
from job_worker.jobs.errors import PermanentJobError


@dataclass(frozen=True)
class GitLimits:
    """What one job of a workspace may bring into the worker (the settings of the same names, upper-cased)."""

    max_blob_bytes: int = DEFAULT_MAX_BLOB_BYTES
    max_fetch_bytes: int = DEFAULT_MAX_FETCH_BYTES
    max_checkout_bytes: int = DEFAULT_MAX_CHECKOUT_BYTES

    @classmethod
    def from_settings(cls, settings: Settings) -> GitLimits:
        return cls(settings.max_blob_bytes, settings.max_fetch_bytes, settings.max_checkout_bytes)

    def fetch_too_large(self, source: str) -> PermanentJobError:
        """A fetch that went over MAX_FETCH_BYTES: stopped there, before the rest of it is received or indexed."""
        return PermanentJobError(
            f"fetching from {source} went over the {self.max_fetch_bytes}-byte limit of MAX_FETCH_BYTES (the "
            "template's MaxFetchBytes parameter) and was stopped there; the tip trees of the branch and its base, "
            "with the branch's commits since it left the base, must fit it: raise MaxFetchBytes (and "
            "WorkerEphemeralStorage with it), or shrink what the tip holds (large files, vendored folders), then "
            "resume the workspace"
        )

    def object_too_large(self, source: str, size: int) -> PermanentJobError:
        return PermanentJobError(
            f"{source} holds a {size}-byte git object, above the {self.max_blob_bytes}-byte limit of MAX_BLOB_BYTES;"
            " remove the file from the branch and its history, or raise MAX_BLOB_BYTES"
        )

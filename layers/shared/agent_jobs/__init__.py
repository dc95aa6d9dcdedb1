"""Agent Jobs shared layer: the job model, message keys, settings, the guard and the producer."""

from agent_jobs.build_platform import check as _check_build_platform

# Before any module of the layer loads a native wheel: a layer built for the other architecture says what to do.
_check_build_platform()

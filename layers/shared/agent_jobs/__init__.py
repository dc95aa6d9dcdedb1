"""Agent Jobs shared layer: the job model, message keys, settings, the guard and the producer."""

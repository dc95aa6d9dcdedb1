"""The pure core of Agent Jobs: the states of a job and a workspace, the transitions between them as data, and the
decisions taken after a lost condition, as functions over typed records. Nothing here talks to AWS; the store
(`agent_jobs.store`) writes what the core allows."""

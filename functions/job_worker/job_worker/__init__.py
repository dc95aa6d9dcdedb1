"""The worker function: `app.lambda_handler` consumes the FIFO jobs queue; `worker` holds the batch logic, one module
per phase, and `jobs` one module per job type and the git workspace."""

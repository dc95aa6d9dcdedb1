"""The test sandbox function: `app.lambda_handler` runs one registered test command on a checkout (`archive`
unpacks it safely, `runner` runs the command and kills what it leaves). Standard library only: no layer."""

"""The producer API function: `app.lambda_handler` answers the HTTP API's routes (`app/`)."""

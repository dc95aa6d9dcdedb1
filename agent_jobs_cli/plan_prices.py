"""The us-east-1 list prices the capacity and cost plan uses, each with the page it was read from and the day."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

MILLION: Final = 1_000_000
READ_ON: Final = "2026-11-29"  # the day the pages below were read


@dataclass(frozen=True)
class Price:
    """One list price: `usd` per `unit`, from `source` (a page read on `read_on`; `page_date` is the date the page
    states for its prices, or None where it states none)."""

    key: str
    service: str
    item: str
    usd: float
    unit: str
    source: str
    read_on: str
    page_date: str | None
    note: str = ""


# us-east-1 list prices, on-demand, first tier, without free tiers.
PRICES: Final[dict[str, Price]] = {
    price.key: price
    for price in (
        Price(
            "sqs_fifo_request",
            "Amazon SQS",
            "FIFO queue request (each 64 KB chunk of a request is one request)",
            0.50 / MILLION,
            "request",
            "https://www.factualminds.com/blog/amazon-sqs-pricing-64kb-rule-fifo-vs-standard/",
            READ_ON,
            "2026-06-13",
            "us-east-1, June 2026; the same $0.50 per million FIFO requests as AWS announced on 2016-11-17 "
            "(https://aws.amazon.com/about-aws/whats-new/2016/11/amazon-sqs-introduces-fifo-queues-with-exactly-once-"
            "processing-and-lower-prices-for-standard-queues/)",
        ),
        Price(
            "lambda_arm_gb_second",
            "AWS Lambda",
            "duration, arm64, first tier",
            0.0000133334,
            "GB-second",
            "https://git.mcrn.ar/mariano/lambda_local_runner/src/commit/957e45b8adae23ce50b966346229585b5df18b4d/"
            "docs/lambdas-md/lambda-13-cost.md?display=rendered",
            READ_ON,
            None,
            "20% below x86's $0.0000166667, as the AWS News Blog's Graviton2 post states (updated 2023-06-19: "
            "https://aws.amazon.com/blogs/aws/aws-lambda-functions-powered-by-aws-graviton2-processor-run-your-"
            "functions-on-arm-and-get-up-to-34-better-price-performance/); the AWS pricing page's stored copy "
            "renders no numbers",
        ),
        Price(
            "lambda_request",
            "AWS Lambda",
            "request (one invocation)",
            0.20 / MILLION,
            "request",
            "https://git.mcrn.ar/mariano/lambda_local_runner/src/commit/957e45b8adae23ce50b966346229585b5df18b4d/"
            "docs/lambdas-md/lambda-13-cost.md?display=rendered",
            READ_ON,
            None,
        ),
        Price(
            "dynamodb_write_request_unit",
            "Amazon DynamoDB",
            "on-demand write request unit (1 KB; 2 per KB in a transaction)",
            0.625 / MILLION,
            "write request unit",
            "https://airbyte.com/data-engineering-resources/dynamodb-pricing",
            READ_ON,
            "2025-07-21",
            "US East, after the on-demand price cut of 2024-11-01",
        ),
        Price(
            "dynamodb_read_request_unit",
            "Amazon DynamoDB",
            "on-demand read request unit (a strongly consistent read of 4 KB)",
            0.125 / MILLION,
            "read request unit",
            "https://airbyte.com/data-engineering-resources/dynamodb-pricing",
            READ_ON,
            "2025-07-21",
        ),
        Price(
            "s3_put",
            "Amazon S3",
            "S3 Standard PUT, COPY, POST, LIST request",
            0.005 / 1000,
            "request",
            "https://c3x.dev/blog/s3-request-fees-explained",
            READ_ON,
            None,
        ),
        Price(
            "s3_get",
            "Amazon S3",
            "S3 Standard GET, SELECT request",
            0.0004 / 1000,
            "request",
            "https://c3x.dev/blog/s3-request-fees-explained",
            READ_ON,
            None,
        ),
        Price(
            "http_api_request",
            "Amazon API Gateway",
            "HTTP API request, first 300 million a month (metered in 512 KB increments)",
            1.00 / MILLION,
            "request",
            "https://awsforengineers.com/blog/aws-api-gateway-pricing-explained",
            READ_ON,
            "2025-05-19",
            "the AWS whitepaper 'Best Practices for Designing Amazon API Gateway Private APIs' (cost optimization, "
            "undated) gives the same $1.00 per million for us-east-1",
        ),
    )
}

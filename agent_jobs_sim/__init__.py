"""Deterministic simulation: the product's own code on a simulated AWS (SQS FIFO with a DLQ, a DynamoDB subset, a
git remote as a compare-and-swap ref store) under a seeded scheduler that injects faults at every step, so a failing
schedule is a seed that replays exactly. Local tooling only: never deployed."""

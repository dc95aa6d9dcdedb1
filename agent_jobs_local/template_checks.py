"""The template facts cfn-lint cannot see as checks.

Each check takes a `TemplateModel` and returns its violations as sentences (empty when the fact holds), so a test can
assert both that the real template is clean and that a broken copy is reported. Values are read with the model's
parameters resolved; where a value comes from a parameter, the parameter's MinValue/MaxValue must keep every
deployable value inside the range too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, Final, TypeAlias

from agent_jobs_local.template import TemplateError, TemplateModel, get_att_target

Check: TypeAlias = Callable[[TemplateModel], list[str]]

LAMBDA_MAX_TIMEOUT_SECONDS: Final = 900
VISIBILITY_TIMEOUT_FACTOR: Final = 6
MIN_MAX_RECEIVE_COUNT: Final = 5
FIFO_BATCH_SIZE_RANGE: Final = (1, 10)
MAXIMUM_CONCURRENCY_RANGE: Final = (2, 1000)
# Managed policies that grant whole services or accounts.
BROAD_MANAGED_POLICY_MARKERS: Final = ("FullAccess", "AdministratorAccess", "PowerUserAccess")


def _number(value: Any, what: str) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise TemplateError(f"{what} must be a number, got {value!r}") from None


def _parameter_of(model: TemplateModel, raw: Any) -> str | None:
    if isinstance(raw, dict) and set(raw) == {"Ref"} and raw["Ref"] in model.parameters:
        return str(raw["Ref"])
    return None


def _range_violations(model: TemplateModel, raw: Any, what: str, low: float, high: float | None) -> list[str]:
    """`raw` (a literal or a !Ref to a parameter) must lie in low..high, and so must the parameter's bounds."""
    if raw is None:
        return [f"{what} is not set"]
    shown = f"{low:g}..{high:g}" if high is not None else f">= {low:g}"
    value = _number(model.resolve(raw), what)
    violations = [] if low <= value and (high is None or value <= high) else [f"{what} is {value:g}, not {shown}"]
    parameter = _parameter_of(model, raw)
    if parameter is not None:
        spec = model.template["Parameters"][parameter]
        for bound, required in (("MinValue", True), ("MaxValue", high is not None)):
            if bound not in spec:
                if required:
                    violations.append(f"{what}: parameter {parameter} has no {bound}, so a deploy can leave {shown}")
                continue
            limit = _number(spec[bound], f"{parameter} {bound}")
            if limit < low or (high is not None and limit > high):
                violations.append(f"{what}: parameter {parameter} {bound} {limit:g} allows values outside {shown}")
    return violations


def _is_true(model: TemplateModel, raw: Any) -> bool:
    return str(model.resolve(raw)).lower() == "true"


def check_fifo_queues(model: TemplateModel) -> list[str]:
    """The jobs queue and its dead-letter queue are FIFO queues (a FIFO source needs a FIFO DLQ)."""
    violations = []
    for queue_id in (model.jobs_queue_id, model.dead_letter_queue_id):
        properties = model.properties(queue_id)
        if not _is_true(model, properties.get("FifoQueue")):
            violations.append(f"{queue_id} is not a FIFO queue (FifoQueue must be true)")
        if not model.queue_name(queue_id).endswith(".fifo"):
            violations.append(f"{queue_id} name {model.queue_name(queue_id)!r} does not end in .fifo")
    return violations


def check_explicit_deduplication(model: TemplateModel) -> list[str]:
    """ContentBasedDeduplication is false: the producer sets MessageDeduplicationId from the jobId and type."""
    violations = []
    for queue_id in (model.jobs_queue_id, model.dead_letter_queue_id):
        raw = model.properties(queue_id).get("ContentBasedDeduplication")
        if raw is None or _is_true(model, raw):
            violations.append(f"{queue_id} must set ContentBasedDeduplication: false, found {raw!r}")
    return violations


def check_high_throughput_fifo(model: TemplateModel) -> list[str]:
    """High-throughput FIFO: deduplication and throughput are per message group (= per workspace)."""
    properties = model.properties(model.jobs_queue_id)
    expected = {"DeduplicationScope": "messageGroup", "FifoThroughputLimit": "perMessageGroupId"}
    return [
        f"{model.jobs_queue_id} {name} is {model.resolve(properties.get(name))!r}, not {value!r}"
        for name, value in expected.items()
        if model.resolve(properties.get(name)) != value
    ]


def check_visibility_timeout(model: TemplateModel) -> list[str]:
    """The queue's VisibilityTimeout is at least 6x the worker's Timeout."""
    timeout = model.worker.timeout_seconds
    raw = model.properties(model.jobs_queue_id).get("VisibilityTimeout", 30)
    visibility = _number(model.resolve(raw), "VisibilityTimeout")
    if visibility < VISIBILITY_TIMEOUT_FACTOR * timeout:
        return [
            f"{model.jobs_queue_id} VisibilityTimeout {visibility:g} is below {VISIBILITY_TIMEOUT_FACTOR} x the "
            f"worker Timeout {timeout} = {VISIBILITY_TIMEOUT_FACTOR * timeout}"
        ]
    return []


def check_redrive_policy(model: TemplateModel) -> list[str]:
    """maxReceiveCount >= 5 and above the worker's MAX_ATTEMPTS: SQS's redrive is a backstop only."""
    redrive = model.properties(model.jobs_queue_id).get("RedrivePolicy")
    if not redrive:
        return [f"{model.jobs_queue_id} has no RedrivePolicy"]
    raw = redrive.get("maxReceiveCount")
    violations = _range_violations(model, raw, "redrive maxReceiveCount", MIN_MAX_RECEIVE_COUNT, None)
    max_attempts = model.function_environment_variable(model.worker.function.function_id, "MAX_ATTEMPTS")
    if max_attempts is None:
        violations.append("the worker has no MAX_ATTEMPTS environment variable")
    elif raw is not None and _number(model.resolve(raw), "maxReceiveCount") <= _number(max_attempts, "MAX_ATTEMPTS"):
        violations.append(
            f"redrive maxReceiveCount {model.resolve(raw)} is not above the worker's MAX_ATTEMPTS {max_attempts}: "
            "SQS would dead-letter a job before the worker can record it DEAD"
        )
    return violations


def check_queue_encryption(model: TemplateModel) -> list[str]:
    """Both queues are encrypted at rest (SQS-managed SSE or a KMS key)."""
    violations = []
    for queue_id in (model.jobs_queue_id, model.dead_letter_queue_id):
        properties = model.properties(queue_id)
        if not _is_true(model, properties.get("SqsManagedSseEnabled")) and not properties.get("KmsMasterKeyId"):
            violations.append(f"{queue_id} is not encrypted: set SqsManagedSseEnabled: true or a KmsMasterKeyId")
    return violations


def check_worker_event_source(model: TemplateModel) -> list[str]:
    """Batch size 1..10 (the FIFO limit), partial batch responses, and a MaximumConcurrency of 2..1000."""
    function_id = model.worker.function.function_id
    events: Mapping[str, Any] = model.function_properties(function_id).get("Events") or {}
    properties = next(event.get("Properties") or {} for event in events.values() if event.get("Type") == "SQS")
    violations = _range_violations(model, properties.get("BatchSize"), "worker BatchSize", *FIFO_BATCH_SIZE_RANGE)
    response_types = model.resolve(properties.get("FunctionResponseTypes"))
    if response_types != ["ReportBatchItemFailures"]:
        violations.append(f"worker FunctionResponseTypes is {response_types!r}, not ['ReportBatchItemFailures']")
    maximum = (properties.get("ScalingConfig") or {}).get("MaximumConcurrency")
    violations += _range_violations(model, maximum, "worker MaximumConcurrency", *MAXIMUM_CONCURRENCY_RANGE)
    return violations


def check_function_timeouts(model: TemplateModel) -> list[str]:
    """Every function's Timeout is within Lambda's 1..900 seconds (cfn-lint lets 1200 through)."""
    violations = []
    for function_id in model.resources_of_type("AWS::Serverless::Function"):
        raw = model.function_properties(function_id).get("Timeout", 3)
        violations += _range_violations(model, raw, f"{function_id} Timeout", 1, LAMBDA_MAX_TIMEOUT_SECONDS)
    return violations


def check_table(model: TemplateModel) -> list[str]:
    """On-demand billing, TTL on `ttl` (garbage collection only), point-in-time recovery, encryption at rest."""
    table_id = model.table_id
    properties = model.resolve(model.properties(table_id))
    violations = []
    if properties.get("BillingMode") != "PAY_PER_REQUEST":
        violations.append(f"{table_id} BillingMode is {properties.get('BillingMode')!r}, not PAY_PER_REQUEST")
    ttl = properties.get("TimeToLiveSpecification") or {}
    if ttl.get("AttributeName") != "ttl" or str(ttl.get("Enabled")).lower() != "true":
        violations.append(f"{table_id} TTL must be enabled on attribute 'ttl', found {ttl!r}")
    pitr = properties.get("PointInTimeRecoverySpecification") or {}
    if str(pitr.get("PointInTimeRecoveryEnabled")).lower() != "true":
        violations.append(f"{table_id} point-in-time recovery is not enabled")
    sse = properties.get("SSESpecification") or {}
    if str(sse.get("SSEEnabled")).lower() != "true":
        violations.append(f"{table_id} SSESpecification.SSEEnabled is not true")
    key = [(k.get("AttributeName"), k.get("KeyType")) for k in properties.get("KeySchema") or []]
    if key != [("pk", "HASH")]:
        violations.append(f"{table_id} key must be pk (HASH only), found {key}")
    return violations


def _statements(document: Any) -> Iterator[Any]:
    statements = (document or {}).get("Statement") if isinstance(document, dict) else None
    if isinstance(statements, dict):
        yield statements
    elif isinstance(statements, list):
        yield from statements


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _statement_violations(where: str, statement: Any) -> list[str]:
    if not isinstance(statement, dict):
        return [f"{where}: statement {statement!r} is not a mapping"]
    if statement.get("Effect") == "Deny":
        return []
    sid = statement.get("Sid", "<no Sid>")
    violations = []
    if "NotAction" in statement:
        violations.append(f"{where} statement {sid}: NotAction allows everything else")
    actions = [action for action in _as_list(statement.get("Action")) if action is not None]
    if not actions and "NotAction" not in statement:
        violations.append(f"{where} statement {sid}: no Action")
    violations += [
        f"{where} statement {sid}: action {action!r} uses a wildcard"
        for action in actions
        if not isinstance(action, str) or "*" in action
    ]
    if "NotResource" in statement:
        violations.append(f"{where} statement {sid}: NotResource allows everything else")
    resources = _as_list(statement.get("Resource"))
    if statement.get("Resource") is None and "NotResource" not in statement:
        violations.append(f"{where} statement {sid}: no Resource")
    violations += [f"{where} statement {sid}: Resource is '*'" for resource in resources if resource == "*"]
    return violations


def _managed_policy_violations(where: str, name: Any) -> list[str]:
    text = str(name)
    if any(marker.lower() in text.lower() for marker in BROAD_MANAGED_POLICY_MARKERS):
        return [f"{where}: managed policy {text} grants a whole service"]
    return []


def check_least_privilege(model: TemplateModel) -> list[str]:
    """Explicit statements only: no wildcard actions, no '*' resources, no *FullAccess-style managed policies."""
    violations = []
    for logical_id, resource in model.resources.items():
        kind = resource.get("Type")
        properties = resource.get("Properties") or {}
        if kind in ("AWS::Serverless::Function", "AWS::Serverless::StateMachine"):
            for index, policy in enumerate(_as_list(properties.get("Policies") or [])):
                where = f"{logical_id} Policies[{index}]"
                if isinstance(policy, dict) and "Statement" in policy:
                    for statement in _statements(policy):
                        violations += _statement_violations(where, statement)
                elif isinstance(policy, dict):
                    template_names = ", ".join(policy)
                    violations.append(f"{where}: SAM policy template {template_names}; write explicit statements")
                else:
                    violations += _managed_policy_violations(where, policy)
        elif kind == "AWS::IAM::Role":
            for arn in properties.get("ManagedPolicyArns") or []:
                violations += _managed_policy_violations(logical_id, arn)
            for policy in properties.get("Policies") or []:
                for statement in _statements(policy.get("PolicyDocument")):
                    violations += _statement_violations(f"{logical_id} {policy.get('PolicyName')}", statement)
            # The trust policy names principals, not actions on resources: not a grant to check here.
        elif kind in ("AWS::IAM::Policy", "AWS::IAM::ManagedPolicy"):
            for statement in _statements(properties.get("PolicyDocument")):
                violations += _statement_violations(logical_id, statement)
    return violations


def _alarms_on(model: TemplateModel, metric: str, queue_id: str) -> list[dict[str, Any]]:
    """Properties of the SQS alarms on `metric` whose QueueName dimension is `!GetAtt <queue_id>.QueueName`."""
    found = []
    for alarm_id in model.resources_of_type("AWS::CloudWatch::Alarm"):
        properties = model.properties(alarm_id)
        if properties.get("Namespace") != "AWS/SQS" or properties.get("MetricName") != metric:
            continue
        queues = [
            get_att_target(d.get("Value")) for d in properties.get("Dimensions") or [] if d.get("Name") == "QueueName"
        ]
        if queues == [(queue_id, "QueueName")]:
            found.append(properties)
    return found


def check_alarms(model: TemplateModel) -> list[str]:
    """An alarm fires on the first dead-lettered job; another on the age of the jobs queue's oldest message."""
    violations = []
    depth_alarms = _alarms_on(model, "ApproximateNumberOfMessagesVisible", model.dead_letter_queue_id)
    fires_on_one = [
        properties
        for properties in depth_alarms
        if (properties.get("ComparisonOperator"), _number(model.resolve(properties.get("Threshold")), "Threshold"))
        in (("GreaterThanThreshold", 0), ("GreaterThanOrEqualToThreshold", 1))
    ]
    if not fires_on_one:
        violations.append(
            f"no alarm fires on one visible message in {model.dead_letter_queue_id} "
            "(ApproximateNumberOfMessagesVisible of its QueueName, GreaterThanThreshold 0)"
        )
    age_alarms = _alarms_on(model, "ApproximateAgeOfOldestMessage", model.jobs_queue_id)
    if not any(str(properties.get("ComparisonOperator", "")).startswith("GreaterThan") for properties in age_alarms):
        violations.append(f"no alarm on ApproximateAgeOfOldestMessage of {model.jobs_queue_id} (GreaterThan...)")
    return violations


CHECKS: Final[tuple[Check, ...]] = (
    check_fifo_queues,
    check_explicit_deduplication,
    check_high_throughput_fifo,
    check_visibility_timeout,
    check_redrive_policy,
    check_queue_encryption,
    check_worker_event_source,
    check_function_timeouts,
    check_table,
    check_least_privilege,
    check_alarms,
)


def template_violations(
    template: TemplateModel | Mapping[str, Any], parameter_overrides: Mapping[str, object] | None = None
) -> list[str]:
    """Every violated template fact, as `check_name: sentence`; empty when all hold."""
    try:
        model = (
            template
            if isinstance(template, TemplateModel)
            else TemplateModel(template, parameter_overrides=parameter_overrides)
        )
    except TemplateError as error:
        return [f"template: {error}"]
    violations = []
    for check in CHECKS:
        try:
            found = check(model)
        except TemplateError as error:
            found = [str(error)]
        violations += [f"{check.__name__}: {violation}" for violation in found]
    return violations

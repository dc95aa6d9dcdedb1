"""template.yaml as data: load it, resolve what local tooling needs, and create its queues and table.

Everything local (tests, the local runtime) reads its settings from here, so nothing keeps a second copy of what is
deployed. cfn-lint's decoder reads the YAML (`loading`); the resolver covers the intrinsic functions this project's
template can use (`intrinsics`); anything it cannot resolve (an attribute of a resource that was not provisioned,
`Fn::ImportValue`, `Fn::Cidr`) raises `TemplateError` rather than guessing. `TemplateModel` reads the functions, queues,
table and bucket (`functions`, `queues`, `buckets`), and `provision` creates them (`provisioning`).
"""

from agent_jobs_local.template.functions import FunctionSettings, SqsEventSource, WorkerSettings
from agent_jobs_local.template.loading import (
    DEFAULT_ACCOUNT_ID,
    DEFAULT_LOCAL_STACK_NAME,
    DEFAULT_REGION,
    DEFAULT_TEMPLATE_PATH,
    References,
    Template,
    TemplateError,
    load_template,
)
from agent_jobs_local.template.model import TemplateModel
from agent_jobs_local.template.provisioning import AwsClients, ProvisionedResources, provision
from agent_jobs_local.template.values import get_att_resource, get_att_target, merge_globals

__all__ = [
    "DEFAULT_ACCOUNT_ID",
    "DEFAULT_LOCAL_STACK_NAME",
    "DEFAULT_REGION",
    "DEFAULT_TEMPLATE_PATH",
    "AwsClients",
    "FunctionSettings",
    "ProvisionedResources",
    "References",
    "SqsEventSource",
    "Template",
    "TemplateError",
    "TemplateModel",
    "WorkerSettings",
    "get_att_resource",
    "get_att_target",
    "load_template",
    "merge_globals",
    "provision",
]

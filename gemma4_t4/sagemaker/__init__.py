"""Deploy Gemma 4 to a SageMaker real-time endpoint with AWS's vLLM container (boto3).

``config`` (typed DeployConfig; fails closed on Turing) -> ``deploy`` (create, wait, roll back
on failure, autoscaling) -> ``ops`` (status, list, logs, invoke, stream, delete) with
``quotas``, ``image`` (DLC tags, the fixed T4 image), ``build`` (that image built in CodeBuild),
``upload`` (a local model folder to S3), ``cost`` and ``reaper`` (the $/hour estimate and the
TTL reaper) and ``cli_recipe`` (dry runs as aws CLI commands); ``image_check`` runs inside the
built image. ``gemma4_t4.standins`` runs all of it offline.
"""

from gemma4_t4.sagemaker.config import DeployConfig
from gemma4_t4.sagemaker.cost import estimate
from gemma4_t4.sagemaker.deploy import deploy, deployment_plan
from gemma4_t4.sagemaker.health import check_health
from gemma4_t4.sagemaker.image import find_vllm_image, vllm_image_uri
from gemma4_t4.sagemaker.ops import (
    delete_endpoint,
    endpoint_logs,
    endpoint_status,
    invoke,
    invoke_stream,
    list_endpoints,
)
from gemma4_t4.sagemaker.quotas import check_quotas, pick_region
from gemma4_t4.sagemaker.reaper import reap

__all__ = [
    "DeployConfig",
    "check_health",
    "check_quotas",
    "delete_endpoint",
    "deploy",
    "deployment_plan",
    "endpoint_logs",
    "endpoint_status",
    "estimate",
    "find_vllm_image",
    "invoke",
    "invoke_stream",
    "list_endpoints",
    "pick_region",
    "reap",
    "vllm_image_uri",
]

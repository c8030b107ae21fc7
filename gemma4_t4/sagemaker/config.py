"""The typed deployment config: the container environment, the production variant and every
resource's tags derive from it. It is checked when it is built, before any AWS call, so bad input is a clear
:class:`Gemma4T4Error`, never a half-created endpoint."""

from __future__ import annotations

import datetime as dt
import os
import re
from collections.abc import Iterable
from typing import Any, ClassVar

from pydantic import ConfigDict, Field, model_validator

from gemma4_t4.catalog.hardware import SAGEMAKER_INSTANCES, sagemaker_price
from gemma4_t4.catalog.models import DEFAULT_MAX_NUM_BATCHED_TOKENS, fit
from gemma4_t4.errors import Gemma4T4Error
from gemma4_t4.foundation import secrets
from gemma4_t4.foundation.jsonable import JSONObject, TypedDict  # pydantic reads ConfigSummary
from gemma4_t4.foundation.launch_record import (
    ASSISTANT_ENV,
    VLLMSettings,
    assistant_never,
    assistant_sets,
    setting,
)
from gemma4_t4.sagemaker import image as images
from gemma4_t4.serving import speculative

PROJECT_TAG = "project"
PROJECT_VALUE = "gemma4-t4"
CREATED_BY_TAG = "created-by"
EXPIRES_TAG = "gemma4-t4:expires-at"
TTL_TAG = "gemma4-t4:ttl-hours"
DEFAULT_SCALING_TARGET = 4.0  # invocations per instance per minute
AUTOSCALING_TAG = "gemma4-t4:autoscaling"  # "MIN..MAX": delete deregisters the scalable target
DEFAULT_MODEL_ID = "google/gemma-4-E2B-it"
DEFAULT_INSTANCE = "ml.g4dn.xlarge"
DEFAULT_REGION = "us-east-2"
ROLE_ENV = "GEMMA4_T4_SAGEMAKER_ROLE_ARN"


def default_region(region: str | None = None) -> str:
    """``region`` where given, else the AWS CLI's and boto3's own variables, else :data:`DEFAULT_REGION`
    (the CLI's and the MCP server's one rule)."""
    return region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or DEFAULT_REGION

_NAME = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$")  # SageMaker resource-name rule
_ROLE = re.compile(r"^arn:aws[a-z-]*:iam::\d{12}:role/[\w+=,.@/-]{1,512}$")
_VLLM_FLAG = re.compile(r"^--[a-z0-9][a-z0-9-]*$")
# A Hugging Face id (org/name) or a path in the container: no whitespace, quotes or shell syntax,
# so nothing a user types can break out of the printed aws CLI recipe.
_MODEL_ID = re.compile(r"^/?[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9._-]+)*$")
_S3_PREFIX = re.compile(r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]/([A-Za-z0-9!_.*'()/-]+/)?$")
CONTAINER_MODEL_DIR = "/opt/ml/model"  # where SageMaker mounts uncompressed S3 model data
# Target tracking on invocations per instance (what SageMaker's own guide uses for real-time endpoints).
SCALING_METRIC = "SageMakerVariantInvocationsPerInstance"


def check_instance_types(instance_types: Iterable[str]) -> None:
    """Each a SageMaker instance type this package knows (its GPU and price)."""
    for instance in instance_types:
        if instance not in SAGEMAKER_INSTANCES:
            raise Gemma4T4Error(f"unsupported SageMaker instance type {instance!r}",
                                fix=f"use one of: {', '.join(SAGEMAKER_INSTANCES)}")


def validate_name(name: str) -> None:
    """SageMaker's resource-name rule (an endpoint, its config and model): no path, no other character."""
    if not _NAME.match(name):
        raise Gemma4T4Error(f"invalid endpoint name {name!r}",
                            fix="use 1-63 letters, digits and hyphens, starting with a letter or digit")


# A private bucket (the model upload and image build buckets).
PUBLIC_ACCESS_BLOCK = dict.fromkeys(
    ("BlockPublicAcls", "IgnorePublicAcls", "BlockPublicPolicy", "RestrictPublicBuckets"), True)


def create_bucket_params(bucket: str, region: str) -> JSONObject:
    """S3 CreateBucket's parameters (model upload and image build buckets): a LocationConstraint outside
    us-east-1."""
    params: JSONObject = {"Bucket": bucket}
    if region != "us-east-1":
        params["CreateBucketConfiguration"] = {"LocationConstraint": region}
    return params


class ConfigSummary(TypedDict):
    """What a deployment will be, as the dry run and the MCP config tool show it (secrets masked)."""

    name: str
    region: str
    model_id: str
    instance_types: list[str]
    image: str
    inference_ami_version: str | None
    dtype: str
    container_env: dict[str, str]
    ttl_hours: float
    turing_fix_required: bool
    model_data: str | None
    instances: str  # "N" or "MIN..MAX (autoscaling)"


def extra_args_to_env(args: list[str]) -> dict[str, str]:
    """vLLM flags -> the container's ``SM_VLLM_*`` variables (the inverse of its launcher):
    ``--enforce-eager --max-num-batched-tokens 1024`` -> ``SM_VLLM_ENFORCE_EAGER=true, ..._TOKENS=1024``."""
    env: dict[str, str] = {}
    words = list(args)
    while words:
        given = words.pop(0)
        flag, inline, value = given.partition("=")
        if not _VLLM_FLAG.match(flag):
            raise Gemma4T4Error(
                f"extra vLLM argument {given!r} is not a --long-flag",
                fix="pass flags like ['--enforce-eager', '--max-num-batched-tokens', '1024']",
            )
        if not inline:  # the next word is its value, unless it is a flag: then a switch
            value = words.pop(0) if words and not words[0].startswith("--") else "true"
        env["SM_VLLM_" + flag[2:].replace("-", "_").upper()] = value
    return env


# an instance type with a price: the only ones an assistant deploys (a budget needs a price to be enforced)
PRICED_INSTANCES = [t for t in SAGEMAKER_INSTANCES if sagemaker_price(t) is not None]


def check_assistant_env(env: dict[str, str]) -> None:
    """Refuse a value an allow-listed container variable does not take. The keys are the MCP tools' schema's
    (``extra_env`` is typed with :data:`ASSISTANT_ENV`'s keys only), which refuses any other variable before a
    tool runs."""
    for key, value in env.items():
        pattern = ASSISTANT_ENV[key]
        if not re.fullmatch(pattern, str(value)):
            raise Gemma4T4Error(f"extra_env {key}={value!r} is not a value it takes", fix=f"use {pattern}")


# SageMaker's value of each vLLM setting left None (DeployConfig.WHEN_UNSET says so in the help)
_SAGEMAKER_DEFAULTS = {"max_model_len": 8192, "max_num_seqs": 4, "gpu_memory_utilization": 0.90, "draft": "off"}


class DeployConfig(VLLMSettings):
    """Everything one SageMaker deployment needs. Model, config and endpoint share ``name``. The fields
    declared with ``setting`` are the user's (CLI flags, MCP parameters); the vLLM settings are
    :class:`VLLMSettings`', with SageMaker's defaults (:data:`WHEN_UNSET`) filled when it is built."""

    model_config = ConfigDict(frozen=True, protected_namespaces=())
    WHEN_UNSET: ClassVar[dict[str, str]] = {
        **{name: f"SageMaker default {value}" for name, value in _SAGEMAKER_DEFAULTS.items()},
        "tensor_parallel_size": "default 1, or what the fit calculator needs on a multi-GPU instance",
        "num_draft_tokens": "default: the assistant's size recipe, 2 for E2B and 26B-A4B, 4 for the others",
    }

    name: str = setting("gemma4-t4", "endpoint name, shared by its model and endpoint config",
                        assistant_sets("deploy never overwrites an existing name"))
    model_id: str = setting(DEFAULT_MODEL_ID, "Hugging Face model id (or a path in the container)",
                            assistant_sets("checked for shell syntax; served from the Hub"))
    region: str = setting(DEFAULT_REGION, "AWS region (default: $AWS_REGION, else us-east-2)", assistant_sets(),
                          resolved=True)
    instance_type: str = setting(DEFAULT_INSTANCE, "SageMaker instance type (ml.g4dn.xlarge: one T4)", assistant_sets(
        "priced types only: a budget without a price cannot be enforced", choices=PRICED_INSTANCES))
    role_arn: str | None = setting(None, f"execution role ARN (default: ${ROLE_ENV})", assistant_never(
        f"the role decides what the endpoint may reach in the account: the user's ${ROLE_ENV}"))
    image_uri: str | None = setting(None, "container image (default on a T4: the newest fixed image in the "
                                    "region's ECR, else the AWS vLLM DLC at the image tag)", assistant_sets(
        "AWS's vLLM DLC at a pinned tag only: another image is another program"))
    image_tag: str = setting(images.DEFAULT_VLLM_TAG, "the AWS vLLM DLC tag (default: the newest -sagemaker-vN.M "
                             f"in the region's registry; {images.DEFAULT_VLLM_TAG} as a labelled fallback)",
                             assistant_sets("pinned AWS vLLM tags only"), resolved=True)
    image_label: str = ""  # which image tag and why (given, the registry's newest, the fallback): from_settings
    fallback_instance_types: list[str] = setting([], "InstancePools fallbacks in priority order (CLI: "
                                                 "comma-separated)", assistant_sets(
        "priced types only, within the budget at the costliest", choices=PRICED_INSTANCES), comma=True,
                                                 metavar="TYPES")
    inference_ami_version: str | None = setting("auto", "'auto' (from the image's CUDA), 'none' or a version",
                                                assistant_sets("'none' would leave g4dn on driver 470, which a "
                                                               "CUDA 13 image cannot use", choices=["auto",
                                                                                                    *images.AMI_DRIVERS]))
    instance_count: int = Field(1, ge=1)
    # SageMaker's limits: ContainerStartupHealthCheckTimeoutInSeconds and ModelDataDownloadTimeoutInSeconds
    startup_timeout_s: int = setting(1800, "container startup health-check timeout, s (60..3600)", assistant_sets(),
                                     ge=60, le=3600, flag="--startup-timeout",
                                     fix="use 1800 for a first start that downloads weights")
    download_timeout_s: int = Field(1800, ge=60, le=3600)
    ttl_hours: float = setting(4.0, "lifetime in hours, a cost guard: `reap` deletes the endpoint after it",
                               assistant_sets("the hours of the budget's bound"), gt=0, le=168,
                               fix="choose a lifetime such as 4 hours; `reap` deletes endpoints past it")
    created_by: str = "gemma4-t4"
    tags: dict[str, str] = {}
    allow_unfixed_image: bool = setting(False, "let a T4 run an image without the Turing fix (only for a vLLM "
                                        "fixed upstream)", assistant_never(
        "a T4 image without the fix crashes at the first prefill, after ~13 billed minutes"))  # _check_image
    model_data_s3_uri: str | None = setting(None, "serve an uploaded model folder: s3://bucket/prefix/",
                                            assistant_sets("an s3:// folder, checked to hold config.json"),
                                            flag="--model-data")
    min_instances: int | None = setting(None, "autoscaling (Application Auto Scaling): at least N instances",
                                        assistant_sets("within the budget"), ge=1, le=20)
    max_instances: int | None = setting(None, "autoscaling: at most M instances (the cost shown is at M)",
                                        assistant_sets("within the budget, which counts all M"), ge=1, le=20)
    # None: not autoscaled (DEFAULT_SCALING_TARGET where it is)
    scaling_target: float | None = setting(None, "autoscaling: invocations per instance per minute the policy holds "
                                           "(default 4; refused without min/max instances)", assistant_sets(), gt=0,
                                           le=10_000)
    scale_in_cooldown_s: int = Field(600, ge=0, le=3600)
    scale_out_cooldown_s: int = Field(300, ge=0, le=3600)

    @model_validator(mode="before")
    @classmethod
    def _sagemaker_defaults(cls, given: Any) -> Any:
        """A vLLM setting left None gets SageMaker's default (:data:`WHEN_UNSET`): the config is complete when built."""
        if isinstance(given, dict):
            given = {**given, **{k: v for k, v in _SAGEMAKER_DEFAULTS.items() if given.get(k) is None}}
            autoscaled = given.get("min_instances") is not None or given.get("max_instances") is not None
            if autoscaled and given.get("scaling_target") is None:
                given["scaling_target"] = DEFAULT_SCALING_TARGET
        return given

    @model_validator(mode="after")
    def _checked(self) -> DeployConfig:
        """Every check that needs no AWS call, when the config is built: a config that exists is one SageMaker
        and vLLM accept (but the role, read from the environment by :meth:`check_role`)."""
        self._check_names()
        self._check_container()
        self._check_scaling()
        self._check_image()
        self._check_image_source()
        return self

    @classmethod
    def from_settings(cls, look_up_image_tag: bool = False, **given: Any) -> DeployConfig:
        """The config a user asked for with CLI flags or MCP parameters: the one place their conventions turn into
        fields, so both refuse alike. None leaves a setting out (its default; the region as
        :func:`default_region` says); inference_ami_version "none" means none, which :meth:`validate` refuses
        where the image needs a newer driver than the instance's default. ``look_up_image_tag``: without an image
        URI or a tag, the newest DLC tag in the region's registry (a read-only lookup; the recorded default when
        it cannot be read), resolved before the config is built; ``image_label`` says which."""
        unknown = sorted(set(given) - set(cls.model_fields))
        if unknown:
            raise TypeError(f"DeployConfig takes no setting {', '.join(unknown)}")
        values = {k: v for k, v in given.items() if v is not None}  # None leaves it out (an MCP null too)
        if values.get("inference_ami_version") == "none":
            values["inference_ami_version"] = None
        values["region"] = default_region(given.get("region"))
        if values.get("image_uri") is not None:
            values["image_label"] = f"{values['image_uri']} (given)"
        elif look_up_image_tag:
            resolved = images.resolve_dlc_tag(values["region"], values.get("image_tag"))
            values.update(image_tag=resolved.tag, image_label=resolved.label)
        return cls(**values)

    # -- derived values -------------------------------------------------------------------
    @property
    def gpu(self) -> str:
        return SAGEMAKER_INSTANCES[self.instance_type][0]

    def resolved_role(self) -> str | None:
        return self.role_arn or os.environ.get(ROLE_ENV) or None

    @property
    def turing_instance_types(self) -> list[str]:
        return [t for t in self.instance_types if SAGEMAKER_INSTANCES[t][0] == "t4"]  # each checked known first

    @property
    def needs_fixed_image(self) -> bool:
        """A Turing host and no explicit opt-out: only an image carrying the fix may run here."""
        return bool(self.turing_instance_types) and not self.allow_unfixed_image

    def resolved_image(self) -> str:
        """The explicit image, else (T4) the fixed image's planned URI in ``<ACCOUNT>`` (``deploy``
        replaces it with the newest fixed image in the region's ECR), else the stock DLC."""
        if self.image_uri:
            return self.image_uri
        if self.needs_fixed_image:  # what a dry run names: the tag build-image writes, in <ACCOUNT>
            return images.t4_image_uri(images.ACCOUNT_PLACEHOLDER, self.region, images.fixed_image_tag(self.image_tag))
        return images.vllm_image_uri(self.region, self.image_tag)

    def resolved_tensor_parallel_size(self) -> int:
        return self.tensor_parallel_size or auto_tensor_parallel(
            self.model_id, self.instance_type, self.max_model_len, self.max_num_seqs)

    @property
    def autoscaling(self) -> bool:
        return bool(self.min_instances or self.max_instances)  # each is 1..20 where given

    @property
    def initial_instances(self) -> int:
        return self.min_instances or self.instance_count

    @property
    def billed_instances_at_most(self) -> int:
        return max(self.max_instances or 0, self.initial_instances)

    def scaling_resource_id(self) -> str:
        return f"endpoint/{self.name}/variant/AllTraffic"

    def resolved_ami_version(self) -> str | None:
        if self.inference_ami_version == "auto":
            needed = [images.required_ami_version(self.resolved_image(), t) for t in self.instance_types]
            known = [n for n in needed if n]
            # one AMI per variant: the newest any pool member needs
            return max(known, key=lambda a: images.AMI_DRIVERS[a][0]) if known else None
        return self.inference_ami_version

    @property
    def instance_types(self) -> list[str]:
        return [self.instance_type, *self.fallback_instance_types]

    def container_env(self) -> dict[str, str]:
        """``SM_VLLM_*`` for the AWS vLLM container; extra_args, then extra_env, override."""
        env = {
            "SM_VLLM_MODEL": CONTAINER_MODEL_DIR if self.model_data_s3_uri else self.model_id,
            "SM_VLLM_SERVED_MODEL_NAME": self.served_model_name or self.model_id.rsplit("/", 1)[-1],
            "SM_VLLM_DTYPE": self.resolved_dtype(),
            "SM_VLLM_MAX_MODEL_LEN": str(self.max_model_len),
            "SM_VLLM_MAX_NUM_SEQS": str(self.max_num_seqs),
            "SM_VLLM_GPU_MEMORY_UTILIZATION": str(self.gpu_memory_utilization),
        }
        tp = self.resolved_tensor_parallel_size()
        if tp > 1:
            env["SM_VLLM_TENSOR_PARALLEL_SIZE"] = str(tp)
        spec = self.draft_plan().config_json()
        if spec:  # the container's launcher turns SM_VLLM_SPECULATIVE_CONFIG into --speculative-config
            env["SM_VLLM_SPECULATIVE_CONFIG"] = spec
        env.update(extra_args_to_env(self.extra_args))
        env.update(self.extra_env)
        return env

    def draft_plan(self) -> speculative.DraftPlan:
        """The drafter of this endpoint; a local folder cannot be one (the container cannot read it)."""
        if self.draft not in speculative.KEYWORDS and os.path.exists(self.draft):
            raise Gemma4T4Error(
                f"--draft {self.draft} is a local folder, which the SageMaker container cannot read",
                fix="pass an assistant hub id (e.g. google/gemma-4-E2B-it-assistant), auto, self or off",
            )
        # the container's vLLM takes its default prefill chunk
        plan = speculative.launch_plan(self, self.model_id, DEFAULT_MAX_NUM_BATCHED_TOKENS,
                                       self.resolved_tensor_parallel_size(), text_only=True)
        if plan.requested == "self":  # the container's own path to the target
            model = CONTAINER_MODEL_DIR if self.model_data_s3_uri else self.model_id
            plan = speculative.DraftPlan("self", plan.method, model, plan.num_speculative_tokens, plan.reason)
        return plan

    # CreateEndpointConfig's and CreateModel's parameters are sent to AWS as built, never read back: plain JSON.
    def production_variant(self) -> JSONObject:
        variant: JSONObject = {
            "VariantName": "AllTraffic", "ModelName": self.name,
            "InitialInstanceCount": self.initial_instances,
            "ContainerStartupHealthCheckTimeoutInSeconds": self.startup_timeout_s,
            "ModelDataDownloadTimeoutInSeconds": self.download_timeout_s}
        if self.fallback_instance_types:
            # SageMaker places the first pool with capacity; quota is reserved for every type listed.
            variant["InstancePools"] = [
                {"InstanceType": t, "Priority": i + 1} for i, t in enumerate(self.instance_types)]
        else:
            variant["InstanceType"] = self.instance_type
        ami = self.resolved_ami_version()
        if ami:
            variant["InferenceAmiVersion"] = ami
        return variant

    def primary_container(self) -> JSONObject:
        container: JSONObject = {"Image": self.resolved_image(), "Environment": self.container_env()}
        if self.model_data_s3_uri:
            # Uncompressed S3 model data: SageMaker copies the prefix to /opt/ml/model, no tarball.
            container["ModelDataSource"] = {"S3DataSource": {
                "S3Uri": self.model_data_s3_uri, "S3DataType": "S3Prefix", "CompressionType": "None"}}
        return container

    def expires_at(self, now: dt.datetime | None = None) -> dt.datetime:
        return (now or dt.datetime.now(dt.UTC)) + dt.timedelta(hours=self.ttl_hours)

    def resource_tags(self, now: dt.datetime | None = None) -> list[dict[str, str]]:
        tags = {PROJECT_TAG: PROJECT_VALUE, CREATED_BY_TAG: self.created_by, TTL_TAG: f"{self.ttl_hours:g}",
                EXPIRES_TAG: self.expires_at(now).strftime("%Y-%m-%dT%H:%M:%SZ"),
                "model-id": self.model_id[:256]}
        if self.autoscaling:
            tags[AUTOSCALING_TAG] = f"{self.initial_instances}..{self.billed_instances_at_most}"
        tags.update(self.tags)
        return [{"Key": k, "Value": v} for k, v in tags.items()]

    # -- validation -----------------------------------------------------------------------
    def _check_names(self) -> None:
        """Region, instance types, endpoint name, model id and model data: each well formed."""
        images.validate_region(self.region)
        check_instance_types(self.instance_types)
        if len(set(self.instance_types)) != len(self.instance_types):
            raise Gemma4T4Error("an instance type appears twice in the pool list",
                                fix="list each fallback instance type once")
        validate_name(self.name)
        if not self.model_id:
            raise Gemma4T4Error("model_id is empty", fix="pass a Hugging Face id such as " + DEFAULT_MODEL_ID)
        if len(self.model_id) > 1024:
            raise Gemma4T4Error(f"model_id is {len(self.model_id):,} characters long: no model id is",
                                fix="pass a Hugging Face id such as " + DEFAULT_MODEL_ID)
        for label, value in (("model_id", self.model_id), ("served_model_name", self.served_model_name)):
            if value is not None and not _MODEL_ID.match(value):
                raise Gemma4T4Error(
                    f"{label} {value!r} has characters a model id never has (whitespace, quotes or shell syntax)",
                    fix="pass a Hugging Face id such as " + DEFAULT_MODEL_ID + " (letters, digits, . _ - /)",
                )
        data = self.model_data_s3_uri
        # "<account>": a dry run's placeholder
        if data is not None and not _S3_PREFIX.match(data.replace("<account>", "0" * 12)):
            raise Gemma4T4Error(f"model data {data!r} is not an s3://bucket/prefix/ folder",
                                fix="upload the folder with `gemma4-t4 sagemaker deploy --model-dir DIR`")

    def _check_container(self) -> None:
        """The context and sequences, and the dtype and tensor parallelism the container really gets (--env,
        --vllm-arg win), suit the instance types."""
        if self.max_model_len < 256:  # SageMaker's stricter floor: a local server takes less
            raise Gemma4T4Error(f"max_model_len={self.max_model_len} must be >= 256",
                                fix="T4 defaults: max_model_len=8192, max_num_seqs=4")
        extra_args_to_env(self.extra_args)
        for key in self.extra_env:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,1023}", key):
                raise Gemma4T4Error(f"invalid environment variable name {key!r}",
                                    fix="use letters, digits and underscores, not starting with a digit")
        # Judge what the container will really get: --env and --vllm-arg override the dtype field.
        env = self.container_env()
        dtype = env.get("SM_VLLM_DTYPE", "")
        if dtype not in ("float16", "bfloat16", "auto", "half", "float32"):
            raise Gemma4T4Error(f"unknown dtype {dtype!r}", fix="use float16 on T4, bfloat16 on L4/A10G")
        turing = self.turing_instance_types
        if turing and dtype in ("bfloat16", "auto"):
            raise Gemma4T4Error(
                f"dtype {dtype} on {turing[0]} (T4, sm_75): Turing has no bf16 and vLLM refuses it"
                + ("" if dtype == self.resolved_dtype()
                   else " (set through --env SM_VLLM_DTYPE or --vllm-arg)"),
                fix="use dtype='float16' (the T4 default) and drop the bf16 override",
            )
        raw_tp = env.get("SM_VLLM_TENSOR_PARALLEL_SIZE", "1")
        if not raw_tp.isdigit() or int(raw_tp) < 1:
            raise Gemma4T4Error(f"tensor parallel size {raw_tp!r} is not a positive integer",
                                fix="use 1, 2 or 4 (or 0 for the fit calculator's choice)")
        tp = int(raw_tp)
        for instance in self.instance_types:
            gpus = SAGEMAKER_INSTANCES[instance][1]
            if tp > gpus:
                raise Gemma4T4Error(
                    f"tensor_parallel_size={tp} but {instance} has {gpus} GPU(s)",
                    fix="lower tensor_parallel_size or pick a multi-GPU instance such as ml.g4dn.12xlarge")

    def _check_image_source(self) -> None:
        """The AMI fits the image, the image is in the endpoint's region, its tag is pinned."""
        if self.inference_ami_version != "auto":  # none too: a CUDA 13 image on g4dn's driver 470 never starts
            images.check_ami_for_image(self.inference_ami_version, self.resolved_image(), self.instance_type)
        ecr_region = re.search(r"\.dkr\.ecr\.([a-z0-9-]+)\.amazonaws", self.image_uri or "")
        if ecr_region and ecr_region[1] != self.region:
            raise Gemma4T4Error(
                f"image {self.image_uri} is in {ecr_region[1]} but the endpoint is in {self.region}",
                fix="SageMaker pulls from ECR in the endpoint's region: replicate the image there or deploy there",
            )
        if self.image_uri is None and images.parse_tag(self.image_tag) is None:
            raise Gemma4T4Error(
                f"image tag {self.image_tag!r} is not a pinned vLLM SageMaker tag",
                fix=f"use a tag like {images.DEFAULT_VLLM_TAG} (floating, -soci and omni tags are refused)")

    def check_role(self) -> None:
        """An IAM execution role ARN, given or from the environment (what a deploy needs, a plan does not)."""
        role = self.resolved_role()
        if not role:
            raise Gemma4T4Error(
                "no SageMaker execution role",
                fix=f"pass role_arn=... (CLI: --role-arn) or set {ROLE_ENV}; docs/sagemaker.md lists "
                "the minimal policy",
            )
        if not _ROLE.match(role):
            raise Gemma4T4Error(f"{role!r} is not an IAM role ARN",
                                fix="use arn:aws:iam::<12-digit account>:role/<name>")

    def _check_scaling(self) -> None:
        """Autoscaling bounds in order, and a scaling target only where the endpoint is autoscaled."""
        if not self.autoscaling:
            if self.scaling_target is not None:
                raise Gemma4T4Error(
                    "--scaling-target applies only to an autoscaled endpoint; alone it would be ignored",
                    fix="add --min-instances N and/or --max-instances M, or drop --scaling-target")
            return
        low = self.min_instances or 1
        high = self.max_instances or low
        if low > high:
            raise Gemma4T4Error(f"min_instances={low}, max_instances={high}: need 1 <= min <= max <= 20",
                                fix="e.g. --min-instances 1 --max-instances 3")

    def _check_image(self) -> None:
        """Fail closed on Turing: the stock vLLM container crashes there at the first prefill."""
        if not self.needs_fixed_image or self.image_uri is None:
            return  # no image given: deploy uses the newest fixed image in ECR, or refuses
        fixed = images.carries_turing_fix(self.image_uri)
        if fixed:
            return
        what = (
            "is AWS's stock vLLM container"
            if fixed is False
            else f"is not a {images.T4_IMAGE_REPOSITORY}:<base tag>{images.FIXED_TAG_MARK}<version> image"
        )
        raise Gemma4T4Error(
            f"image {self.image_uri} {what}, which lacks the Turing attention fix: on a T4 "
            f"({', '.join(self.turing_instance_types)}, sm_75, 64 KiB shared memory) vLLM's attention kernel asks "
            "for 96 KiB at Gemma 4's first prefill and the endpoint crashes",
            fix=f"build the fixed image once (gemma4-t4 sagemaker build-image --region {self.region}), then deploy "
            "without --image-uri (the newest fixed image in ECR is used) or with --image-uri of that image; "
            "--allow-unfixed-image only for an image whose vLLM is fixed upstream",
        )

    def summary(self) -> ConfigSummary:
        return {
            "name": self.name,
            "region": self.region,
            "model_id": self.model_id,
            "instance_types": self.instance_types,
            "image": self.resolved_image(),
            "inference_ami_version": self.resolved_ami_version(),
            "dtype": self.resolved_dtype(),
            "container_env": secrets.mask_env(self.container_env()),  # HF_TOKEN hidden, token counts not
            "ttl_hours": self.ttl_hours,
            "turing_fix_required": self.needs_fixed_image,
            "model_data": self.model_data_s3_uri,
            "instances": (
                f"{self.initial_instances}..{self.billed_instances_at_most} (autoscaling)"
                if self.autoscaling
                else str(self.instance_count)
            ),
        }


def _guess_format(model_id: str) -> str:
    lowered = model_id.lower()
    if "emb4" in lowered:
        return "emb4"
    return "qat-w4a16" if any(k in lowered for k in ("qat", "w4a16", "int4")) else "bf16"


def auto_tensor_parallel(
    model_id: str, instance_type: str, context_len: int = 8192, max_num_seqs: int = 4
) -> int:
    """The smallest tensor-parallel size at which the fit calculator says the model fits the host.

    1 on single-GPU hosts and for models the calculator does not know (a local folder, another
    family); on ``ml.g4dn.12xlarge`` (4x T4) the 26B-A4B and 31B need 2 or 4.
    """
    gpu, gpus = SAGEMAKER_INSTANCES.get(instance_type, ("", 1))
    if gpus <= 1:
        return 1
    try:
        for size in (1, 2, 4, 8):
            if size > gpus:
                break
            result = fit(
                model_id,
                _guess_format(model_id),
                gpu=gpu,
                context_len=context_len,
                num_gpus=size,
                max_num_seqs=max_num_seqs,
            )
            if result.fits:
                return size
    except Gemma4T4Error:
        return 1
    return gpus

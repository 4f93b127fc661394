"""The message catalogue (English and Chinese) and the renderers for denials and warnings.

Every message names the field, the limit and the fix; the long form also names the object and the
container (it goes into a denial and the logs), the short form fits an admission warning, which
kubectl prints on one line (kept under 120 characters).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from hami.quantity import format_mib
from hami.validation.host import BASELINE_CAPABILITIES
from hami.validation.model import Finding, Mode, Violation

WARNING_LIMIT = 119
_BASELINE = ", ".join(sorted(BASELINE_CAPABILITIES))

_EN: dict[str, tuple[str, str]] = {
    "privileged": (
        "privileged mode gives the container full control of the host (every device, every capability), "
        "an open door for container escape. Limit: privileged is not allowed. Fix: remove "
        "securityContext.privileged or set it to false; add only the baseline capabilities you need",
        "container '{container}' is privileged; set securityContext.privileged: false",
    ),
    "capability": (
        "adds capability {capability}, outside the Pod Security 'baseline' set ({baseline}). "
        "Fix: remove {capability} from securityContext.capabilities.add",
        "container '{container}' adds capability {capability} (not baseline); remove it",
    ),
    "host-network": (
        "hostNetwork: true puts the pod in the node's network namespace (host-only services, all traffic). "
        "Limit: host namespaces are not allowed. Fix: remove hostNetwork or set it to false; use a Service",
        "pod uses hostNetwork; remove it or set it to false",
    ),
    "host-pid": (
        "hostPID: true shares the node's process namespace (the pod can see and signal every host process). "
        "Limit: host namespaces are not allowed. Fix: remove hostPID or set it to false",
        "pod uses hostPID; remove it or set it to false",
    ),
    "host-ipc": (
        "hostIPC: true shares the node's IPC namespace (host processes' shared memory). "
        "Limit: host namespaces are not allowed. Fix: remove hostIPC or set it to false",
        "pod uses hostIPC; remove it or set it to false",
    ),
    "host-process": (
        "windowsOptions.hostProcess: true runs the container as a Windows HostProcess, directly on the host. "
        "Fix: remove securityContext.windowsOptions.hostProcess or set it to false",
        "container '{container}' is a Windows HostProcess; remove windowsOptions.hostProcess",
    ),
    "host-process-pod": (
        "windowsOptions.hostProcess: true runs every container as a Windows HostProcess, directly on the host. "
        "Fix: remove spec.securityContext.windowsOptions.hostProcess or set it to false",
        "pod is a Windows HostProcess; remove securityContext.windowsOptions.hostProcess",
    ),
    "socket-mounted": (
        "mounts volume '{volume}' (hostPath {host_path}, read as {normal}, {volume_path}), which exposes the "
        "container runtime socket: whoever talks to it controls every container on the node. Limit: runtime "
        "sockets and the directories above them must not be mounted. Fix: remove the volume mount and the "
        "hostPath volume; build images with a rootless builder (BuildKit, kaniko) instead",
        "container '{container}' mounts the runtime socket (volume '{volume}', {normal}); remove it",
    ),
    "socket-volume": (
        "hostPath volume '{volume}' ({host_path}, read as {normal}) exposes the container runtime socket; any "
        "container, e.g. one added by kubectl debug, could mount it. Fix: remove the volume",
        "volume '{volume}' exposes the runtime socket ({normal}); remove it",
    ),
    "gpu-count": (
        "asks for {total} GPUs per pod ({breakdown}; Kubernetes' effective request), above the cap of {cap} "
        "in namespace {namespace}. Fix: ask for at most {cap} GPUs, or share GPUs with memory slices "
        "(hami.io/vgpu-memory, nvidia.com/gpumem); bigger jobs belong in a namespace with a higher cap",
        "pod asks for {total} GPUs; the cap in {namespace} is {cap} per pod",
    ),
    "memory-required": (
        "shares a GPU ({cores}% of its cores) without saying how much GPU memory it needs, so it would take the "
        "whole card's memory. Fix: also set hami.io/vgpu-memory (e.g. 4Gi), nvidia.com/gpumem (MiB) or "
        "nvidia.com/gpumem-percentage",
        "container '{container}' shares a GPU ({cores}% cores) without a memory size; set hami.io/vgpu-memory",
    ),
    "memory-max": (
        "asks for {mib_h} of GPU memory per device, more than the largest card in the cluster ({card_h}); it "
        "could never be scheduled. Limit: {card_h}. Fix: ask for at most {card_h} per device, or more GPUs",
        "container '{container}' asks {mib_h} GPU memory; largest card is {card_h}",
    ),
    "granularity": (
        "asks for {mib} MiB of GPU memory, not a multiple of the slicing granularity ({step} MiB). "
        "Fix: use {suggest} MiB ({suggest_h})",
        "container '{container}': GPU memory {mib}Mi is not a multiple of {step}Mi; use {suggest}Mi",
    ),
    "cores-range": (
        "asks for {value}% of a GPU's cores; GPU cores are a percentage of one device. Limit: 0..100. "
        "Fix: use 1 to 100 (100 = the whole device)",
        "container '{container}': GPU cores {value}% outside 0..100",
    ),
    "percent-range": (
        "asks for {value}% of a GPU's memory; the memory percentage is of one device. Limit: 0..100. "
        "Fix: use 1 to 100, or a size with hami.io/vgpu-memory",
        "container '{container}': GPU memory {value}% outside 0..100",
    ),
    "memory-zero": (
        "asks for no GPU memory ({value}); a GPU slice needs memory. Fix: set a positive size, e.g. "
        "hami.io/vgpu-memory: 4Gi",
        "container '{container}' asks for zero GPU memory; set a positive size",
    ),
    "malformed": (
        "{value!r} is not a Kubernetes quantity. Fix: write e.g. '2' for a count, '4096' for nvidia.com/gpumem "
        "(MiB), '8Gi' for hami.io/vgpu-memory",
        "container '{container}': {value!r} is not a quantity",
    ),
    "negative": (
        "{value!r} is negative. Fix: use a value of 0 or more",
        "container '{container}': {value!r} is negative",
    ),
    "fractional": (
        "{value!r} is not a whole number; extended resources must be integers. Fix: use a whole number "
        "(share a GPU with memory slices instead of fractional counts)",
        "container '{container}': {value!r} must be a whole number",
    ),
    "no-limit": (
        "requests {resource}: {request} without a limit; extended resources cannot be overcommitted: requests "
        "must equal limits. Fix: set resources.limits[{resource}] to {request} (a request defaults to the limit)",
        "container '{container}': {resource} needs limits equal to requests",
    ),
    "differs": (
        "requests {resource}: {request} but limits it to {limit}; extended resources cannot be overcommitted: "
        "requests must equal limits. Fix: give both the same value (or only set the limit)",
        "container '{container}': {resource} requests {request} != limits {limit}; make them equal",
    ),
    "quota": (
        "namespace {namespace}'s {dimension} quota exceeded: used {used_h} + requested {requested_h} = {total_h}, "
        "limit {limit_h}. Fix: ask for less, wait for or stop other GPU pods in {namespace}, or ask the platform "
        "team to raise the quota",
        "{namespace} {dimension} quota: used {used_h} + asked {requested_h} > limit {limit_h}",
    ),
    "quota-template": (
        "one pod of this template asks for {dimension} {requested_h}, above namespace {namespace}'s {dimension} "
        "quota of {limit_h}: its pods could never run. Fix: ask for at most {limit_h} per pod",
        "one pod asks {dimension} {requested_h}; the {namespace} quota is {limit_h}",
    ),
}

_ZH: dict[str, tuple[str, str]] = {
    "privileged": (
        "特权模式（privileged）让容器完全控制宿主机（所有设备、所有能力），是容器逃逸的后门。限制：禁止特权模式。"
        "修复：删除 securityContext.privileged 或设为 false；如需能力，只添加 baseline 允许的能力",
        "容器 '{container}' 开启了特权模式；请设置 securityContext.privileged: false",
    ),
    "capability": (
        "添加了能力 {capability}，超出 Pod 安全标准 baseline 允许的集合（{baseline}）。"
        "修复：从 securityContext.capabilities.add 中删除 {capability}",
        "容器 '{container}' 添加了能力 {capability}（超出 baseline）；请删除",
    ),
    "host-network": (
        "hostNetwork: true 让 Pod 使用节点的网络命名空间（可访问仅限宿主机的服务和全部流量）。"
        "限制：禁止使用宿主机命名空间。修复：删除 hostNetwork 或设为 false；对外提供服务请使用 Service",
        "Pod 使用了 hostNetwork；请删除或设为 false",
    ),
    "host-pid": (
        "hostPID: true 让 Pod 共享节点的进程命名空间（可查看并向任意宿主机进程发信号）。限制：禁止使用宿主机命名空间。"
        "修复：删除 hostPID 或设为 false",
        "Pod 使用了 hostPID；请删除或设为 false",
    ),
    "host-ipc": (
        "hostIPC: true 让 Pod 共享节点的 IPC 命名空间（宿主机进程的共享内存）。限制：禁止使用宿主机命名空间。"
        "修复：删除 hostIPC 或设为 false",
        "Pod 使用了 hostIPC；请删除或设为 false",
    ),
    "host-process": (
        "windowsOptions.hostProcess: true 让容器以 Windows HostProcess 方式直接运行在宿主机上。"
        "修复：删除 securityContext.windowsOptions.hostProcess 或设为 false",
        "容器 '{container}' 是 Windows HostProcess；请删除 windowsOptions.hostProcess",
    ),
    "host-process-pod": (
        "windowsOptions.hostProcess: true 让所有容器以 Windows HostProcess 方式直接运行在宿主机上。"
        "修复：删除 spec.securityContext.windowsOptions.hostProcess 或设为 false",
        "Pod 是 Windows HostProcess；请删除 securityContext.windowsOptions.hostProcess",
    ),
    "socket-mounted": (
        "挂载了卷 '{volume}'（hostPath {host_path}，规范化为 {normal}，{volume_path}），暴露了容器运行时 Socket："
        "能访问它就能控制节点上的所有容器。限制：禁止挂载运行时 Socket 及其上级目录。"
        "修复：删除该卷挂载和 hostPath 卷；构建镜像请使用无特权构建工具（BuildKit rootless、kaniko）",
        "容器 '{container}' 挂载了运行时 Socket（卷 '{volume}'，{normal}）；请删除",
    ),
    "socket-volume": (
        "hostPath 卷 '{volume}'（{host_path}，规范化为 {normal}）暴露了容器运行时 Socket；"
        "任何容器（例如 kubectl debug 添加的容器）都可以挂载它。修复：删除该卷",
        "卷 '{volume}' 暴露了运行时 Socket（{normal}）；请删除",
    ),
    "gpu-count": (
        "单个 Pod 申请 {total} 张 GPU（{breakdown}；按 Kubernetes 有效请求计算），超出命名空间 {namespace} "
        "的上限（每个 Pod 最多 {cap} 张）。修复：最多申请 {cap} 张 GPU，或用显存切分共享 GPU"
        "（hami.io/vgpu-memory、nvidia.com/gpumem）；更大的任务请在上限更高的命名空间运行",
        "Pod 申请 {total} 张 GPU；{namespace} 每个 Pod 最多 {cap} 张",
    ),
    "memory-required": (
        "共享 GPU（{cores}% 算力）却未声明所需显存，会占用整卡显存。修复：同时设置 hami.io/vgpu-memory"
        "（如 4Gi）、nvidia.com/gpumem（MiB）或 nvidia.com/gpumem-percentage",
        "容器 '{container}' 共享 GPU（{cores}% 算力）但未声明显存；请设置 hami.io/vgpu-memory",
    ),
    "memory-max": (
        "每张卡申请 {mib_h} 显存，超过集群中最大的显卡（{card_h}），永远无法调度。限制：{card_h}。"
        "修复：每张卡最多申请 {card_h}，或改用更多 GPU",
        "容器 '{container}' 申请 {mib_h} 显存；最大显卡为 {card_h}",
    ),
    "granularity": (
        "申请 {mib} MiB 显存，不是切分粒度（{step} MiB）的整数倍。修复：改为 {suggest} MiB（{suggest_h}）",
        "容器 '{container}'：显存 {mib}Mi 不是 {step}Mi 的整数倍；请改为 {suggest}Mi",
    ),
    "cores-range": (
        "申请单卡 {value}% 的算力；GPU 算力是单卡的百分比。限制：0..100。修复：使用 1 到 100（100 = 整卡）",
        "容器 '{container}'：GPU 算力 {value}% 超出 0..100",
    ),
    "percent-range": (
        "申请单卡 {value}% 的显存；显存百分比以单卡计。限制：0..100。"
        "修复：使用 1 到 100，或用 hami.io/vgpu-memory 指定大小",
        "容器 '{container}'：显存百分比 {value}% 超出 0..100",
    ),
    "memory-zero": (
        "申请的显存为零（{value}）；GPU 切分必须包含显存。修复：设置正数大小，例如 hami.io/vgpu-memory: 4Gi",
        "容器 '{container}' 申请的显存为零；请设置正数大小",
    ),
    "malformed": (
        "{value!r} 不是合法的 Kubernetes 数量。修复：例如数量写 '2'，nvidia.com/gpumem 写 '4096'（MiB），"
        "hami.io/vgpu-memory 写 '8Gi'",
        "容器 '{container}'：{value!r} 不是合法数量",
    ),
    "negative": (
        "{value!r} 是负数。修复：使用 0 或更大的值",
        "容器 '{container}'：{value!r} 是负数",
    ),
    "fractional": (
        "{value!r} 不是整数；扩展资源必须是整数。修复：使用整数（需要部分 GPU 请用显存切分，而不是小数张数）",
        "容器 '{container}'：{value!r} 必须是整数",
    ),
    "no-limit": (
        "requests 中申请了 {resource}: {request} 但没有 limits；扩展资源不能超售：requests 必须等于 limits。"
        "修复：把 resources.limits[{resource}] 设为 {request}（requests 默认等于 limits）",
        "容器 '{container}'：{resource} 的 limits 必须等于 requests",
    ),
    "differs": (
        "requests 中 {resource} 为 {request}，limits 却为 {limit}；扩展资源不能超售：requests 必须等于 limits。"
        "修复：两者设为相同的值（或只设置 limits）",
        "容器 '{container}'：{resource} requests {request} != limits {limit}；请设为相同",
    ),
    "quota": (
        "命名空间 {namespace} 的{dimension}配额超限：已用 {used_h} + 本次申请 {requested_h} = {total_h}，"
        "上限 {limit_h}。修复：减少申请量，等待或停止 {namespace} 中其他 GPU Pod，或联系平台团队提高配额",
        "{namespace} {dimension}配额：已用 {used_h} + 申请 {requested_h} > 上限 {limit_h}",
    ),
    "quota-template": (
        "该模板的单个 Pod 申请{dimension} {requested_h}，超过命名空间 {namespace} 的{dimension}配额 {limit_h}，"
        "其 Pod 永远无法运行。修复：每个 Pod 最多申请 {limit_h}",
        "单个 Pod 申请{dimension} {requested_h}；{namespace} 配额为 {limit_h}",
    ),
}
CATALOGUE: Mapping[str, Mapping[str, tuple[str, str]]] = {"en": _EN, "zh": _ZH}
_DIMENSIONS = {
    "en": {"memory": "GPU memory", "cores": "GPU cores", "gpus": "GPU count"},
    "zh": {"memory": "GPU 显存", "cores": "GPU 算力", "gpus": "GPU 卡数"},
}


def _mib(value: int) -> str:
    try:
        return format_mib(value)
    except OverflowError:  # absurd sizes (10**400 MiB) still get a message
        return f"{value}Mi"


def _amount(dimension: str, value: int) -> str:
    if dimension == "memory":
        return _mib(value)
    return f"{value}%" if dimension == "cores" else str(value)


def _derived(params: Mapping[str, Any], language: str) -> dict[str, Any]:
    """Human forms of the raw figures, so messages say '80Gi' rather than '81920'."""
    values: dict[str, Any] = {"baseline": _BASELINE, **params}
    for key in ("mib", "card", "suggest"):
        if isinstance(values.get(key), int):
            values[f"{key}_h"] = _mib(values[key])
    dimension = values.get("dimension")
    if isinstance(dimension, str):
        for key in ("used", "requested", "limit"):
            values[f"{key}_h"] = _amount(dimension, values[key])
        values["total_h"] = _amount(dimension, values["used"] + values["requested"])
        values["dimension"] = _DIMENSIONS[language][dimension]
    return values


def subject(kind: str, namespace: str, name: str, container: str | None, language: str) -> str:
    target = f"{kind} {namespace}/{name or '<unnamed>'}" if namespace else f"{kind} {name or '<unnamed>'}"
    if container is None:
        return target
    return f"{target} 的容器 '{container}'" if language == "zh" else f"{target}, container '{container}'"


def shorten(text: str, limit: int = WARNING_LIMIT) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def render(finding: Finding, mode: Mode, kind: str, namespace: str, name: str, language: str) -> Violation:
    long_form, short_form = CATALOGUE[language][finding.key]
    params = _derived({"container": finding.container or "", **finding.params}, language)
    who = subject(kind, namespace, name, finding.container, language)
    if language == "zh":
        message = f"{who}（{finding.path}）：{long_form.format(**params)}"
    else:
        message = f"{who} ({finding.path}): {long_form.format(**params)}"
    warning = shorten(f"hami/{finding.rule}: {short_form.format(**params)}")
    return Violation(finding.rule, mode, finding.path, message, warning)


def render_denial(
    violations: Iterable[Violation], kind: str, name: str, language: str = "en", namespace: str = ""
) -> str:
    """One message listing every enforced violation (the first alone rarely tells the whole story)."""
    enforced = [v for v in violations if v.mode is Mode.ENFORCE]
    name = f"{namespace}/{name}" if namespace else name
    if language == "zh":
        head = f"hami-webhook 拒绝了 {kind} {name}：共 {len(enforced)} 项策略违规"
    else:
        plural = "violation" if len(enforced) == 1 else "violations"
        head = f"hami-webhook denied {kind} {name}: {len(enforced)} policy {plural}"
    lines = [f"[{i}] {v.message}" for i, v in enumerate(enforced, 1)]
    return "\n".join([head, *lines])


def render_warnings(violations: Iterable[Violation]) -> list[str]:
    """Admission warnings for the violations in warn mode, each under 120 characters."""
    return [v.warning for v in violations if v.mode is Mode.WARN]

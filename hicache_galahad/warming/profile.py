"""What warm and ready know of the server: its identity, geometry and storage settings, read
from its /server_info and /model_info (or an Engine's server arguments) and checked, so that a
malformed answer is a one-line `ServerError`, never a crash later."""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass, field

from ..errors import ServerError

DTYPE_ARGS = ("kv_cache_dtype", "mamba_ssm_dtype", "dtype")
PIN_BUDGET_KEYS = ("max_bytes", "max_pinned_bytes")  # the server's; a pin obeys them
DEFAULT_PREFETCH_THRESHOLD = 256  # SGLang 0.5.23's, when the extra config names none
MAX_EXTRA_CONFIG_BYTES = 1 << 20
# SGLang's `storage_model_name`: the served model name, tagged with the host pool's page
# format when it has one of its own (pool_host/unified.py), is the model_name a pool's
# storage config carries, which the backend writes into each namespace's geometry.
STORAGE_FORMAT_TAGS = ("unified-token-major",)


@dataclass
class ServerProfile:
    """What warm and ready need to know of the server."""

    model_path: str
    served_model_name: str
    tokenizer_path: str
    page_size: int
    tp_size: int
    pp_size: int
    root: str | None
    tenant: str
    model_fingerprint: str | None
    dtypes: dict
    write_policy: str | None
    prefetch_threshold: int = DEFAULT_PREFETCH_THRESHOLD
    store_options: dict = field(default_factory=dict)  # the budget a pin must respect
    extra_config_problem: str | None = None  # why the extra config could not be read
    raw: dict = field(default_factory=dict, repr=False)

    @classmethod
    def from_args(cls, args: dict, model: dict | None = None) -> ServerProfile:
        """From SGLang's server arguments (/server_info) and /model_info (which reports the
        model after a weight update); ServerError when either is malformed."""
        if not isinstance(args, dict) or not isinstance(model or {}, dict):
            raise ServerError("the server's /server_info or /model_info is not a JSON object")
        model = model or {}
        extra, problem = read_extra_config(args.get("hicache_storage_backend_extra_config"))
        model_path = _text(model.get("model_path") or args.get("model_path") or "")
        page_size = _positive_int("page_size", args.get("page_size") or 1)
        threshold = extra.get("prefetch_threshold", DEFAULT_PREFETCH_THRESHOLD)
        return cls(
            model_path=model_path,
            served_model_name=_text(
                model.get("served_model_name") or args.get("served_model_name") or model_path
            ),
            tokenizer_path=_text(
                model.get("tokenizer_path") or args.get("tokenizer_path") or model_path
            ),
            page_size=page_size,
            tp_size=_positive_int("tp_size", args.get("tp_size") or 1),
            pp_size=_positive_int("pp_size", args.get("pp_size") or 1),
            root=_text(extra["root"]) if extra.get("root") else None,
            tenant=_text(extra.get("tenant") or "default"),
            model_fingerprint=_text(extra["model_fingerprint"])
            if extra.get("model_fingerprint")
            else None,
            dtypes={name: str(args.get(name)) for name in DTYPE_ARGS},
            write_policy=_text(args["hicache_write_policy"])
            if args.get("hicache_write_policy")
            else None,
            prefetch_threshold=max(_positive_int("prefetch_threshold", threshold), page_size),
            store_options={key: extra[key] for key in PIN_BUDGET_KEYS if key in extra},
            extra_config_problem=problem,
            raw=args,
        )

    def storage_model_names(self) -> set[str]:
        """The model names this server's pools carry into their namespaces' geometry."""
        name = self.served_model_name
        return {name} | {f"{name}-{tag}" if name else tag for tag in STORAGE_FORMAT_TAGS}


def read_extra_config(value) -> tuple[dict, str | None]:
    """The server's --hicache-storage-backend-extra-config as a dict (a JSON text, "@file", or
    already a dict), and why it could not be read (None when it could). The file is read from
    this machine, bounded (a regular file of at most 1 MiB), never followed into a FIFO."""
    if value is None or value == "":
        return {}, None
    if isinstance(value, dict):
        return value, None
    if not isinstance(value, str):
        return {}, f"the extra config is a {type(value).__name__}, not JSON text"
    text = value
    if value.startswith("@"):
        try:
            text = _read_small_regular(value[1:])
        except OSError as error:
            return {}, f"cannot read {value[1:]} ({error.strerror or error})"
        except ValueError as error:
            return {}, str(error)
    try:
        parsed = json.loads(text)
    except (ValueError, RecursionError):
        return {}, "the extra config is not JSON"
    if not isinstance(parsed, dict):
        return {}, "the extra config is not a JSON object"
    return parsed, None


def _read_small_regular(path: str) -> str:
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError(f"{path} is not a regular file")
        data = os.read(fd, MAX_EXTRA_CONFIG_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_EXTRA_CONFIG_BYTES:
        raise ValueError(f"{path} is larger than {MAX_EXTRA_CONFIG_BYTES} bytes")
    return data.decode("utf-8", errors="replace")


def _positive_int(name: str, value) -> int:
    number = 0
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str) and value.strip().isdigit() and len(value) <= 20:
        number = int(value)
    if not 1 <= number <= 1 << 40:
        raise ServerError(f"the server reports {name}={value!r}: expected a positive integer")
    return number


def _text(value) -> str:
    if not isinstance(value, str | int | float) or isinstance(value, bool):
        raise ServerError(f"the server reports {value!r} where a name or path belongs")
    return str(value)

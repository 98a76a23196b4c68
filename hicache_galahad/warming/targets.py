"""The server warm and ready talk to: a running server over HTTP (`HttpTarget`) or an
in-process `sglang.Engine` (`EngineTarget`, duck-typed: nothing of SGLang is imported here).
Each answers the same four questions: its profile, a text's token ids, a prefill of one output
token (its `meta_info`), a cache flush."""

from __future__ import annotations

from ..errors import ServerError
from .http import DEFAULT_DEADLINE_S, HttpServer
from .keys import token_ids_checked
from .profile import DTYPE_ARGS, ServerProfile

ENGINE_ARGS = (
    "model_path",
    "served_model_name",
    "tokenizer_path",
    "page_size",
    "tp_size",
    "pp_size",
    "hicache_storage_backend_extra_config",
    "hicache_write_policy",
    *DTYPE_ARGS,
)  # SGLang's ServerArgs is not always a plain object (vars() can be empty)


def prefill_body(input_ids: list[int], request: dict) -> dict:
    """A prompt-only request: the token ids, one output token, greedy."""
    return {
        "input_ids": input_ids,
        "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
        **request,
    }


class HttpTarget:
    """A running server, over HTTP; every call bounded (warming/http.py)."""

    def __init__(self, url: str, timeout_s: float = DEFAULT_DEADLINE_S):
        self.server = HttpServer(url, deadline_s=timeout_s)
        self.url = self.server.url
        self._tokenizer = None

    def _object(self, path: str, body: dict | None = None) -> dict:
        answer = self.server.call_json(path, body)
        if not isinstance(answer, dict):
            raise ServerError(f"{self.url}{path}: the answer is not a JSON object")
        return answer

    def profile(self) -> ServerProfile:
        return ServerProfile.from_args(self._object("/server_info"), self._object("/model_info"))

    def tokenize(self, text: str) -> list[int]:
        answer = self._object("/tokenize", {"prompt": text, "add_special_tokens": True})
        tokens = answer.get("tokens")
        if not isinstance(tokens, list):
            raise ServerError(f"{self.url}/tokenize: the answer has no list of tokens")
        try:
            return token_ids_checked(tokens)
        except ValueError as error:
            raise ServerError(f"{self.url}/tokenize: {error}") from None

    def tokenizer(self, profile: ServerProfile):
        """A local tokenizer for Blaise's prompt layout (its own encode calls), loaded from the
        path the server reports, as `galahad blaise ask` does."""
        if self._tokenizer is None:
            from transformers import AutoTokenizer  # only for --sections

            self._tokenizer = AutoTokenizer.from_pretrained(profile.tokenizer_path)
        return self._tokenizer

    def prefill(self, input_ids: list[int], request: dict) -> dict:
        meta = self._object("/generate", prefill_body(input_ids, request)).get("meta_info")
        return meta if isinstance(meta, dict) else {}

    def flush(self) -> bool:
        try:
            self.server.call("/flush_cache", {})
            return True
        except ServerError:
            return False  # refused while requests run: the resend still recomputes


class EngineTarget:
    """An in-process `sglang.Engine`."""

    def __init__(self, engine):
        self.engine = engine

    def profile(self) -> ServerProfile:
        args = getattr(self.engine, "server_args", None)
        if args is None:
            args = self.engine.tokenizer_manager.server_args
        return ServerProfile.from_args({name: getattr(args, name, None) for name in ENGINE_ARGS})

    def tokenizer(self, profile: ServerProfile | None):
        return self.engine.tokenizer_manager.tokenizer

    def tokenize(self, text: str) -> list[int]:
        return token_ids_checked(self.tokenizer(None).encode(text))

    def prefill(self, input_ids: list[int], request: dict) -> dict:
        body = prefill_body(input_ids, request)
        output = self.engine.generate(
            input_ids=body.pop("input_ids"), sampling_params=body.pop("sampling_params"), **body
        )
        return dict(output.get("meta_info", {})) if isinstance(output, dict) else {}

    def flush(self) -> bool:
        result = self.engine.flush_cache()
        return bool(getattr(result, "success", True))


def as_target(target, timeout_s: float = DEFAULT_DEADLINE_S) -> HttpTarget | EngineTarget:
    """A URL or an `sglang.Engine` (or a target already) as a target."""
    if isinstance(target, HttpTarget | EngineTarget):
        return target
    if isinstance(target, str):
        return HttpTarget(target, timeout_s)
    if hasattr(target, "generate") and hasattr(target, "tokenizer_manager"):
        return EngineTarget(target)
    raise TypeError(f"target must be a server URL or an sglang.Engine, not {type(target)}")

